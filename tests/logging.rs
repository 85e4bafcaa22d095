//! The logger as the daemon installs it (one global subscriber per process,
//! so one test): RUST_LOG-style filters per target, `log` records (what
//! scx_utils writes) bridged into it, spans on each line, and the JSON format.

use scx_zernel::logging::{self, Captured, LogFormat};

#[test]
fn filters_bridge_spans_and_json() {
    let out = Captured::default();
    let filter = logging::filter(Some("warn,logging=debug,scx_utils=info"), None).unwrap();
    logging::init_with(filter, LogFormat::Json, out.clone()).unwrap();

    {
        let _pass = tracing::debug_span!("pass", n = 7).entered();
        let _stage = tracing::debug_span!("observe").entered();
        tracing::debug!("phase tid=42 comm=\"x\" Unknown -> GpuCompute");
    }
    // A `log` record from another crate: bridged, filtered by its own target.
    log::info!(target: "scx_utils", "from scx_utils via log");
    log::debug!(target: "scx_utils", "scx_utils debug: filtered out");
    tracing::info!(target: "other", "other info: filtered out");

    let text = out.text();
    let lines: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert_eq!(lines.len(), 2, "{text}");

    let phase = &lines[0];
    assert_eq!(phase["level"], "DEBUG", "{phase}");
    assert_eq!(phase["fields"]["message"], "phase tid=42 comm=\"x\" Unknown -> GpuCompute", "{phase}");
    assert_eq!(phase["span"]["name"], "observe", "{phase}");
    assert_eq!(phase["spans"][0]["name"], "pass", "{phase}");
    assert_eq!(phase["spans"][0]["n"], 7, "{phase}");
    assert!(phase["timestamp"].is_string(), "{phase}");

    let bridged = &lines[1];
    assert_eq!(bridged["level"], "INFO", "{bridged}");
    assert_eq!(bridged["fields"]["message"], "from scx_utils via log", "{bridged}");
    assert_eq!(bridged["target"], "scx_utils", "{bridged}");
}
