//! OpenMetrics / Prometheus endpoint: `GET /metrics` answers the latest
//! [`Metrics`] in the Prometheus text format (version 0.0.4).
//!
//! ```text
//!   daemon pass ──fill──> Metrics ──clone──> Arc<Mutex<Metrics>> <──lock, clone── server thread
//!                                                                                     │ render
//!   scraper ── TCP: "GET /metrics HTTP/1.1" ──────────────────────────────────────────> text
//! ```
//!
//! Every field of [`Metrics`] becomes one metric family `zernel_<field>`,
//! with the field's `desc` from the scx_stats derive as its HELP text. The
//! fields are taken from the struct's serde representation, so a field added
//! to [`Metrics`] is exported without touching this file. A field is a gauge
//! when it is in [`GAUGES`] (a level: threads now, map fill); every other
//! field is a cumulative counter and gets the `_total` suffix.
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
use log::{info, warn};
use scx_stats::prelude::Meta;

use crate::stats::Metrics;

/// Fields of [`Metrics`] that are levels, not cumulative counts.
pub const GAUGES: &[&str] = &[
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
pub const PREFIX: &str = "zernel_";

/// The Content-Type of the answer (Prometheus text exposition format).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The longest a connection may take, from accept to the last byte written.
pub const IO_DEADLINE: Duration = Duration::from_secs(2);

/// Requests longer than this (request line and headers) are refused.
const MAX_REQUEST: usize = 8192;

/// Escapes a HELP text: backslash and newline.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The metrics in the Prometheus text format: for each field of `m`,
/// a HELP line, a TYPE line and the sample.
pub fn render(m: &Metrics) -> String {
    let meta = Metrics::meta();
    let value = serde_json::to_value(m).unwrap_or_default();
    let Some(fields) = value.as_object() else { return String::new() };
    let mut out = String::with_capacity(fields.len() * 120);
    for (field, v) in fields {
        let sample = match v {
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => u8::from(*b).to_string(),
            serde_json::Value::Object(_) if field == "tenants" => {
                render_tenants(&m.tenants, &mut out);
                continue;
            }
            _ => continue,
        };
        let gauge = GAUGES.contains(&field.as_str());
        let name = if gauge { format!("{PREFIX}{field}") } else { format!("{PREFIX}{field}_total") };
        let desc = meta.fields.get(field).and_then(|f| f.attrs.desc.as_deref()).unwrap_or(field);
        out.push_str(&format!(
            "# HELP {name} {}\n# TYPE {name} {}\n{name} {sample}\n",
            escape_help(desc),
            if gauge { "gauge" } else { "counter" }
        ));
    }
    out
}

/// Per-tenant gauges, one series per tenant: `zernel_tenant_<x>{tenant="a"}`.
fn render_tenants(tenants: &std::collections::BTreeMap<String, crate::stats::TenantMetrics>, out: &mut String) {
    if tenants.is_empty() {
        return;
    }
    let meta = crate::stats::TenantMetrics::meta();
    let rows: Vec<(String, serde_json::Value)> =
        tenants.iter().map(|(n, t)| (n.clone(), serde_json::to_value(t).unwrap_or_default())).collect();
    let Some(first) = rows[0].1.as_object() else { return };
    for field in first.keys() {
        let name = format!("{PREFIX}tenant_{field}");
        let desc = meta.fields.get(field).and_then(|f| f.attrs.desc.as_deref()).unwrap_or(field);
        out.push_str(&format!("# HELP {name} {}\n# TYPE {name} gauge\n", escape_help(desc)));
        for (tenant, v) in &rows {
            if let Some(x) = v.get(field).and_then(|x| x.as_f64()) {
                let label = tenant.replace('\\', "\\\\").replace('"', "\\\"");
                out.push_str(&format!("{name}{{tenant=\"{label}\"}} {x}\n"));
            }
        }
    }
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
                            log::debug!("metrics: {e}");
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
    let line = String::from_utf8_lossy(head.split(|&b| b == b'\n').next().unwrap_or_default());
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET", "/metrics") => {
            let m = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
            ("200 OK", render(&m))
        }
        ("GET", _) => ("404 Not Found", "not found; metrics are at /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "only GET /metrics\n".to_string()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n",
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

    fn sample() -> Metrics {
        Metrics { ml_enqueued: 42, threads: 7, phase_transitions: 3, map_capacity: 65536, ..Default::default() }
    }

    #[test]
    fn every_field_has_help_type_and_value() {
        let text = render(&sample());
        let meta = Metrics::meta();
        assert!(!meta.fields.is_empty());
        // Every scalar field; the per-tenant map is checked below.
        let scalars: Vec<_> = meta.fields.iter().filter(|(f, _)| f.as_str() != "tenants").collect();
        for (field, f) in &scalars {
            let gauge = GAUGES.contains(&field.as_str());
            let name = if gauge { format!("zernel_{field}") } else { format!("zernel_{field}_total") };
            let desc = f.attrs.desc.as_deref().unwrap();
            assert!(text.contains(&format!("# HELP {name} {desc}\n")), "{name}:\n{text}");
            let kind = if gauge { "gauge" } else { "counter" };
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}:\n{text}");
            assert_eq!(text.lines().filter(|l| l.starts_with(&format!("{name} "))).count(), 1, "{name}");
        }
        assert_eq!(text.lines().count(), scalars.len() * 3);
        assert!(text.contains("\nzernel_ml_enqueued_total 42\n"), "{text}");
        assert!(text.contains("\nzernel_threads 7\n"), "{text}");
        assert!(text.contains("\nzernel_phase_transitions_total 3\n"), "{text}");
        assert!(text.contains("\nzernel_map_capacity 65536\n"), "{text}");
        // Tenants: one labelled gauge series per tenant and field.
        let mut m = sample();
        let t = crate::stats::TenantMetrics::compute(&[30, 10], &[3072, 1024]);
        m.tenants = [("a\"x".to_string(), t[0].clone()), ("b".to_string(), t[1].clone())].into();
        let text = render(&m);
        assert!(text.contains("# TYPE zernel_tenant_share_pct gauge\n"), "{text}");
        assert!(text.contains("zernel_tenant_share_pct{tenant=\"a\\\"x\"} 75\n"), "{text}");
        assert!(text.contains("zernel_tenant_weight{tenant=\"b\"} 1\n"), "{text}");
        assert!(text.contains("\nzernel_steals_total 0\n"), "{text}");
    }

    #[test]
    fn gauge_list_names_real_fields() {
        let meta = Metrics::meta();
        for g in GAUGES {
            assert!(meta.fields.contains_key(*g), "GAUGES names {g}, which is not a Metrics field");
        }
    }

    #[test]
    fn metric_names_and_help_are_well_formed() {
        let text = render(&sample());
        for line in text.lines() {
            let name = line.trim_start_matches("# HELP ").trim_start_matches("# TYPE ");
            let name = name.split(' ').next().unwrap();
            assert!(
                name.starts_with("zernel_") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
        }
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
