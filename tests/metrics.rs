//! The OpenMetrics endpoint over real TCP: serve on 127.0.0.1 (any port),
//! scrape with a raw TcpStream, parse the answer in the format the Accept
//! header asked for, check its updates, the 404,
//! and that a client that never sends its request does not block others.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use scx_zernel::openmetrics as endpoint;
use scx_zernel::stats::Metrics;

/// Sends `request` and returns (status line, headers, body).
fn fetch(addr: SocketAddr, request: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end in {raw:?}"));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

fn start() -> (SocketAddr, Arc<Mutex<Metrics>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let current = Arc::new(Mutex::new(Metrics::default()));
    endpoint::serve_on(listener, current.clone()).unwrap();
    (addr, current)
}

#[test]
fn scrape_metrics_over_tcp() {
    use openmetrics_parser::{openmetrics, prometheus};
    let (addr, current) = start();
    current.lock().unwrap().ml_enqueued = 17;
    current.lock().unwrap().threads = 5;

    // What Prometheus sends: OpenMetrics.
    let (status, headers, body) = fetch(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(headers.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"), "{headers}");
    let len: usize =
        headers.lines().find_map(|l| l.strip_prefix("Content-Length: ")).expect("Content-Length").parse().unwrap();
    assert_eq!(len, body.len());
    assert!(body.ends_with("# EOF\n"), "{body}");
    let exp = openmetrics::parse_openmetrics(&body).unwrap_or_else(|e| panic!("{e:?}\n{body}"));
    assert!(exp.families.contains_key("zernel_ml_enqueued"), "{body}");
    assert!(body.contains("# TYPE zernel_ml_enqueued counter\n"), "{body}");
    assert!(body.contains("\nzernel_ml_enqueued_total 17\n"), "{body}");
    assert!(body.contains("# TYPE zernel_threads gauge\n"), "{body}");
    assert!(body.contains("\nzernel_threads 5\n"), "{body}");
    assert_eq!(body, endpoint::render(&current.lock().unwrap(), endpoint::Format::OpenMetrics));

    // No Accept header (curl, wget): OpenMetrics too.
    let (_, headers, body) = fetch(addr, "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(headers.contains("Content-Type: application/openmetrics-text;"), "{headers}");
    openmetrics::parse_openmetrics(&body).unwrap_or_else(|e| panic!("{e:?}\n{body}"));

    // The 0.0.4 text on request; the next scrape sees what the daemon stored since.
    current.lock().unwrap().ml_enqueued = 18;
    let (_, headers, body) = fetch(addr, "GET /metrics?x=1 HTTP/1.0\r\naccept: text/plain;version=0.0.4\r\n\r\n");
    assert!(headers.contains("Content-Type: text/plain; version=0.0.4"), "{headers}");
    let exp = prometheus::parse_prometheus(&body).unwrap_or_else(|e| panic!("{e:?}\n{body}"));
    assert!(exp.families.contains_key("zernel_ml_enqueued_total"), "{body}");
    assert!(body.contains("\nzernel_ml_enqueued_total 18\n"), "{body}");
    assert!(!body.contains("# EOF"), "{body}");
}

#[test]
fn other_paths_and_methods_are_refused() {
    let (addr, _) = start();
    let (status, _, _) = fetch(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (status, _, _) = fetch(addr, "GET /metricsx HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (status, headers, _) = fetch(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(headers.contains("Allow: GET"), "{headers}");
}

#[test]
fn a_stuck_client_does_not_block_scrapes() {
    let (addr, _) = start();
    // Connects and never sends a request.
    let _stuck = TcpStream::connect(addr).unwrap();
    // Sends half a request line and stalls.
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /metr").unwrap();

    let t = Instant::now();
    let (status, _, body) = fetch(addr, "GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("zernel_threads 0"), "{body}");
    // Two stuck connections ahead of us, each given at most IO_DEADLINE.
    assert!(t.elapsed() < endpoint::IO_DEADLINE * 2 + Duration::from_secs(3), "took {:?}", t.elapsed());
}

#[test]
fn cli_documents_and_describes_the_stats() {
    use scx_stats::prelude::Meta;
    let bin = env!("CARGO_BIN_EXE_scx_zernel");
    let out = std::process::Command::new(bin).arg("--help-stats").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for (field, f) in Metrics::meta().fields {
        let line = text.lines().find(|l| l.trim_start().starts_with(&format!("{field} "))).unwrap_or_else(|| {
            panic!("--help-stats does not describe {field}:\n{text}");
        });
        assert!(line.contains(f.attrs.desc.as_deref().unwrap()), "{line}");
    }

    let out = std::process::Command::new(bin).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in ["--monitor <SECS>", "--help-stats", "--metrics-addr <ADDR>", "127.0.0.1:9093", "observe"] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }

    for bad in ["0", "-1", "nan"] {
        let out = std::process::Command::new(bin).arg(format!("--monitor={bad}")).output().unwrap();
        assert!(!out.status.success(), "--monitor {bad} accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--monitor"), "--monitor {bad}");
    }
}
