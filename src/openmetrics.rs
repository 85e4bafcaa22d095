//! OpenMetrics / Prometheus endpoint: `GET /metrics` answers the latest
//! [`Metrics`] in the OpenMetrics text format 1.0.0 (ending `# EOF`), or in
//! the Prometheus text format 0.0.4 when the client's Accept header prefers
//! it. Both are written by the prometheus-client crate.
//!
//! ```text
//!   daemon pass ──fill──> Metrics ──clone──> Arc<Mutex<Metrics>> <──lock, clone── server thread
//!                                                                                     │ Collector
//!   scraper ── TCP: "GET /metrics", Accept: ... ──> negotiate ──> OpenMetrics | 0.0.4 text
//! ```
//!
//! Every field of [`Metrics`] becomes one metric family `zernel_<field>`,
//! with the field's `desc` from the scx_stats derive as its HELP text. The
//! fields are taken from the struct's serde representation, so a field added
//! to [`Metrics`] is exported without touching this file. A field is a gauge
//! when it is in [`GAUGES`] (a level: threads now, map fill); every other
//! field is a cumulative counter, whose sample is `zernel_<field>_total`
//! (the family is `zernel_<field>` in OpenMetrics, `zernel_<field>_total`
//! in the 0.0.4 format). Tenants' shares are gauges with a `tenant` label.
//!
//! Negotiation: of the Accept header's media ranges, the one with the
//! highest q wins; `application/openmetrics-text` gives OpenMetrics,
//! `text/plain` the 0.0.4 format, and anything else (no header, `*/*`)
//! OpenMetrics. A tie goes to OpenMetrics.
//!
//! The server is std only: one thread, one request per connection, read and
//! write deadlines so a slow or stuck client delays the next scrape by at
//! most [`IO_DEADLINE`]. Anything but `GET /metrics` is answered 404 (other
//! paths) or 405 (other methods).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use scx_stats::prelude::Meta;
use tracing::{info, warn};

use crate::stats::Metrics;

/// Fields of [`Metrics`] that are levels, not cumulative counts.
pub(crate) const GAUGES: &[&str] = &[
    "threads",
    "ml_threads",
    "phase_data_loading",
    "phase_gpu_compute",
    "phase_nccl_collective",
    "phase_optimizer_step",
    "observe_pass_us",
    "map_entries",
    "map_capacity",
];

/// Prefix of every metric name.
pub(crate) const PREFIX: &str = "zernel_";

/// The longest a connection may take, from accept to the last byte written.
pub const IO_DEADLINE: Duration = Duration::from_secs(2);

/// The Content-Type of error answers.
const TEXT: &str = "text/plain; charset=utf-8";

/// Requests longer than this (request line and headers) are refused.
const MAX_REQUEST: usize = 8192;

/// The two text formats served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
    /// Prometheus text exposition format 0.0.4.
    Prometheus,
}

impl Format {
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }

    /// The format an Accept header asks for (see the module doc).
    pub(crate) fn negotiate(accept: Option<&str>) -> Format {
        let mut best = (Format::OpenMetrics, -1.0_f64);
        for range in accept.unwrap_or("").split(',') {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or("").to_ascii_lowercase();
            let q = params
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
                .unwrap_or(1.0);
            let format = match media.as_str() {
                "application/openmetrics-text" => Format::OpenMetrics,
                "text/plain" => Format::Prometheus,
                _ => continue,
            };
            if q > best.1 || (q == best.1 && format == Format::OpenMetrics) {
                best = (format, q);
            }
        }
        if best.1 <= 0.0 {
            Format::OpenMetrics
        } else {
            best.0
        }
    }
}

/// Escapes a HELP text: backslash and newline.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// One scrape's values, handed to prometheus-client as a collector.
#[derive(Debug)]
struct Snapshot(Metrics);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let m = &self.0;
        let meta = Metrics::meta();
        let value = serde_json::to_value(m).unwrap_or_default();
        let Some(fields) = value.as_object() else { return Ok(()) };
        for (field, v) in fields {
            if field == "tenants" {
                encode_tenants(&m.tenants, &mut encoder)?;
                continue;
            }
            let Some(n) = v.as_u64() else { continue };
            let help = escape_help(meta.fields.get(field).and_then(|f| f.attrs.desc.as_deref()).unwrap_or(field));
            if GAUGES.contains(&field.as_str()) {
                let g = ConstGauge::new(n);
                g.encode(encoder.encode_descriptor(field, &help, None, g.metric_type())?)?;
            } else {
                let c = ConstCounter::new(n);
                c.encode(encoder.encode_descriptor(field, &help, None, c.metric_type())?)?;
            }
        }
        Ok(())
    }
}

/// Per-tenant gauges, one series per tenant: `zernel_tenant_<x>{tenant="a"}`.
fn encode_tenants(
    tenants: &std::collections::BTreeMap<String, crate::stats::TenantMetrics>,
    encoder: &mut DescriptorEncoder,
) -> std::fmt::Result {
    let Some(first) = tenants.values().next() else { return Ok(()) };
    let meta = crate::stats::TenantMetrics::meta();
    let rows: Vec<(&String, serde_json::Value)> =
        tenants.iter().map(|(n, t)| (n, serde_json::to_value(t).unwrap_or_default())).collect();
    let Some(fields) = serde_json::to_value(first).ok().and_then(|v| v.as_object().cloned()) else { return Ok(()) };
    for field in fields.keys() {
        let name = format!("tenant_{field}");
        let help = escape_help(meta.fields.get(field).and_then(|f| f.attrs.desc.as_deref()).unwrap_or(field));
        let mut family =
            encoder.encode_descriptor(&name, &help, None, prometheus_client::metrics::MetricType::Gauge)?;
        for (tenant, v) in &rows {
            if let Some(x) = v.get(field).and_then(|x| x.as_f64()) {
                let labels = [("tenant", tenant.as_str())];
                ConstGauge::new(x).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// The metrics in `format`.
pub fn render(m: &Metrics, format: Format) -> String {
    let mut registry = Registry::with_prefix(PREFIX.trim_end_matches('_'));
    registry.register_collector(Box::new(Snapshot(m.clone())));
    let mut out = String::with_capacity(8192);
    let written = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry),
    };
    if written.is_err() {
        // Writing into a String cannot fail; keep the answer well-formed anyway.
        out.clear();
        if format == Format::OpenMetrics {
            out.push_str("# EOF\n");
        }
    }
    out
}

/// Binds `addr` and serves `current` at `http://addr/metrics` from a
/// background thread. The caller keeps `current` up to date.
pub fn serve(addr: SocketAddr, current: Arc<Mutex<Metrics>>) -> Result<JoinHandle<()>> {
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot serve metrics on {addr}"))?;
    serve_on(listener, current)
}

/// Like [`serve`], on a listener the caller bound (e.g. on port 0, to learn
/// the port from `local_addr` first).
pub fn serve_on(listener: TcpListener, current: Arc<Mutex<Metrics>>) -> Result<JoinHandle<()>> {
    let local = listener.local_addr().context("metrics listener address")?;
    let handle = std::thread::Builder::new()
        .name("zernel-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &current) {
                            tracing::debug!("metrics: {e}");
                        }
                    }
                    Err(e) => {
                        // Out of fds and the like: do not spin.
                        warn!("metrics: accept on {local}: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .context("starting the metrics thread")?;
    info!("serving OpenMetrics at http://{local}/metrics");
    Ok(handle)
}

/// Reads the request head until the blank line, the size limit or the deadline.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() > MAX_REQUEST {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "request head incomplete"));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf)? {
            0 => break,
            n => head.extend_from_slice(&buf[..n]),
        }
    }
    Ok(head)
}

/// Answers one request and closes the connection.
fn answer(mut stream: TcpStream, current: &Mutex<Metrics>) -> std::io::Result<()> {
    let deadline = Instant::now() + IO_DEADLINE;
    stream.set_write_timeout(Some(IO_DEADLINE))?;
    let head = read_head(&mut stream, deadline)?;
    let line = String::from_utf8_lossy(head.split(|&b| b == b'\n').next().unwrap_or_default()).into_owned();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head = String::from_utf8_lossy(&head);
    let accept = head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("accept").then_some(v.trim())
    });
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            let m = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let format = Format::negotiate(accept);
            ("200 OK", format.content_type(), render(&m, format))
        }
        ("GET", _) => ("404 Not Found", TEXT, "not found; metrics are at /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", TEXT, "only GET /metrics\n".to_string()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        response.push_str("Allow: GET\r\n");
    }
    response.push_str("\r\n");
    response.push_str(&body);
    stream.write_all(response.as_bytes())?;
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use openmetrics_parser::{
        openmetrics, prometheus, OpenMetricsType, OpenMetricsValue, PrometheusType, PrometheusValue,
    };

    fn sample() -> Metrics {
        let mut m =
            Metrics { ml_enqueued: 42, threads: 7, phase_transitions: 3, map_capacity: 65536, ..Default::default() };
        let t = crate::stats::TenantMetrics::compute(&[30, 10], &[3072, 1024]);
        m.tenants = [("a\"x".to_string(), t[0].clone()), ("b".to_string(), t[1].clone())].into();
        m
    }

    /// (field, gauge?, help) of every scalar field.
    fn scalars() -> Vec<(String, bool, String)> {
        let meta = Metrics::meta();
        let v: Vec<_> = meta
            .fields
            .iter()
            .filter(|(f, _)| f.as_str() != "tenants")
            .map(|(f, m)| (f.clone(), GAUGES.contains(&f.as_str()), m.attrs.desc.clone().unwrap()))
            .collect();
        assert!(v.len() > 20);
        v
    }

    #[test]
    fn openmetrics_parses_with_every_field_typed_and_described() {
        let text = render(&sample(), Format::OpenMetrics);
        assert!(text.ends_with("\n# EOF\n"), "{text}");
        let exp = openmetrics::parse_openmetrics(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        for (field, gauge, help) in scalars() {
            let name = format!("zernel_{field}");
            let fam = exp.families.get(&name).unwrap_or_else(|| panic!("no family {name}:\n{text}"));
            assert_eq!(fam.help, help, "{name}");
            let want = if gauge { OpenMetricsType::Gauge } else { OpenMetricsType::Counter };
            assert_eq!(fam.family_type, want, "{name}");
            assert_eq!(fam.iter_samples().count(), 1, "{name}");
        }
        let value = |name: &str| match &exp.families[name].iter_samples().next().unwrap().value {
            OpenMetricsValue::Counter(c) => c.value.as_f64(),
            OpenMetricsValue::Gauge(g) => g.as_f64(),
            v => panic!("{name}: {v:?}"),
        };
        assert_eq!(value("zernel_ml_enqueued"), 42.0);
        assert_eq!(value("zernel_phase_transitions"), 3.0);
        assert_eq!(value("zernel_threads"), 7.0);
        assert_eq!(value("zernel_map_capacity"), 65536.0);
        // Counter samples carry the _total suffix in the text.
        assert!(text.contains("\nzernel_ml_enqueued_total 42\n"), "{text}");
        // Tenants: one labelled gauge series per tenant.
        let share = &exp.families["zernel_tenant_share_pct"];
        assert_eq!(share.family_type, OpenMetricsType::Gauge);
        let by_tenant: Vec<(String, f64)> = share
            .iter_samples()
            .map(|s| {
                let OpenMetricsValue::Gauge(g) = &s.value else { panic!("{:?}", s.value) };
                (s.get_labelset().unwrap().get_label_value("tenant").unwrap().to_string(), g.as_f64())
            })
            .collect();
        assert_eq!(by_tenant, vec![("a\"x".to_string(), 75.0), ("b".to_string(), 25.0)]);
    }

    #[test]
    fn prometheus_text_parses_with_every_field_typed_and_described() {
        let text = render(&sample(), Format::Prometheus);
        assert!(!text.contains("# EOF"), "{text}");
        let exp = prometheus::parse_prometheus(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        for (field, gauge, help) in scalars() {
            let name = if gauge { format!("zernel_{field}") } else { format!("zernel_{field}_total") };
            let fam = exp.families.get(&name).unwrap_or_else(|| panic!("no family {name}:\n{text}"));
            assert_eq!(fam.help, help, "{name}");
            let want = if gauge { PrometheusType::Gauge } else { PrometheusType::Counter };
            assert_eq!(fam.family_type, want, "{name}");
        }
        let PrometheusValue::Counter(c) =
            &exp.families["zernel_ml_enqueued_total"].iter_samples().next().unwrap().value
        else {
            panic!()
        };
        assert_eq!(c.value.as_f64(), 42.0);
        assert_eq!(exp.families["zernel_tenant_weight"].iter_samples().count(), 2);
    }

    #[test]
    fn the_parser_rejects_what_is_not_openmetrics() {
        // The check above can fail: the 0.0.4 text, or OpenMetrics without its
        // `# EOF`, is not OpenMetrics.
        let om = render(&sample(), Format::OpenMetrics);
        assert!(openmetrics::parse_openmetrics(om.trim_end_matches("# EOF\n")).is_err());
        assert!(openmetrics::parse_openmetrics(&render(&sample(), Format::Prometheus)).is_err());
    }

    #[test]
    fn accept_header_negotiation() {
        use Format::*;
        // What Prometheus sends by default.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prom)), OpenMetrics);
        assert_eq!(Format::negotiate(None), OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), OpenMetrics);
        assert_eq!(Format::negotiate(Some("text/plain;version=0.0.4")), Prometheus);
        assert_eq!(Format::negotiate(Some("Text/Plain")), Prometheus);
        assert_eq!(Format::negotiate(Some("application/openmetrics-text;q=0.4, text/plain;q=0.9")), Prometheus);
        assert_eq!(Format::negotiate(Some("text/plain, application/openmetrics-text")), OpenMetrics);
        assert_eq!(Format::negotiate(Some("text/plain;q=0")), OpenMetrics);
        assert_eq!(OpenMetrics.content_type(), "application/openmetrics-text; version=1.0.0; charset=utf-8");
        assert!(Prometheus.content_type().starts_with("text/plain; version=0.0.4"));
    }

    #[test]
    fn gauge_list_names_real_fields() {
        let meta = Metrics::meta();
        for g in GAUGES {
            assert!(meta.fields.contains_key(*g), "GAUGES names {g}, which is not a Metrics field");
        }
    }

    #[test]
    fn help_is_escaped() {
        assert_eq!(escape_help("a\\b\nc"), "a\\\\b\\nc");
    }

    #[test]
    fn bind_error_names_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = serve(addr, Arc::new(Mutex::new(Metrics::default()))).unwrap_err();
        assert!(format!("{e:#}").contains(&addr.to_string()), "{e:#}");
    }
}
