//! Logging: `tracing` events and spans, written to stderr by
//! `tracing-subscriber`, as text lines or as JSON objects (one a line, for
//! fleets' log collectors).
//!
//! ```text
//!   --log-level FILTER ─┐ (else RUST_LOG, else "info")
//!                       v
//!   tracing events ──> EnvFilter ──> fmt: "LEVEL span{field=..}: message" | JSON
//!   log records (scx_utils, libbpf-rs) ──> tracing-log bridge ──┘
//! ```
//!
//! A filter is what `RUST_LOG` takes (`EnvFilter` directives): a level
//! (`debug`), or targets with levels (`scx_zernel::daemon=debug,info`).
//! A bare word that is not a level is refused rather than taken as a target
//! name, so `--log-level verbose` is an error, not silence.
//!
//! The daemon's loop runs each pass in a `pass{n=..}` span and its stages
//! (`reload`, `observe`, `write`) in spans of their own, all at debug level:
//! a debug log shows which pass and stage a line came from, an info log
//! stays as short as before.

use std::io::Write;

use anyhow::{anyhow, Result};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `LEVEL span{field=..}: message`, one event a line.
    #[default]
    Text,
    /// One JSON object a line: timestamp, level, target, fields (the
    /// message among them), the current span and the list of spans.
    Json,
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// The filter from `--log-level` if given, else from `RUST_LOG` (if set
/// and not empty), else `info`. The error names where the filter came from.
pub fn filter(cli: Option<&str>, rust_log: Option<&str>) -> Result<EnvFilter> {
    let (origin, dirs) = match (cli, rust_log.filter(|s| !s.trim().is_empty())) {
        (Some(c), _) => ("--log-level", c),
        (None, Some(env)) => ("RUST_LOG", env),
        (None, None) => return Ok(EnvFilter::new("info")),
    };
    for d in dirs.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !d.contains('=') && !d.contains('[') && !LEVELS.contains(&d.to_ascii_lowercase().as_str()) {
            return Err(anyhow!(
                "{origin} '{dirs}': '{d}' is not a level ({}); a target takes one as TARGET=LEVEL",
                LEVELS.join(", ")
            ));
        }
    }
    EnvFilter::try_new(dirs).map_err(|e| anyhow!("{origin} '{dirs}': {e}"))
}

/// Installs the global subscriber writing to `writer`, and the bridge that
/// turns `log` records (from scx_utils and libbpf-rs) into events.
pub fn init_with<W>(filter: EnvFilter, format: LogFormat, writer: W) -> Result<()>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(false);
    let installed = match format {
        LogFormat::Text => builder.without_time().with_target(false).try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(true).try_init(),
    };
    installed.map_err(|e| anyhow!("cannot install the logger: {e}"))
}

/// [`init_with`] on stderr.
pub fn init(filter: EnvFilter, format: LogFormat) -> Result<()> {
    init_with(filter, format, std::io::stderr)
}

/// A writer into a shared buffer (tests read what was logged).
#[derive(Clone, Default)]
pub struct Captured(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shows(f: &EnvFilter) -> String {
        f.to_string()
    }

    #[test]
    fn cli_beats_rust_log_which_beats_the_default() {
        assert_eq!(shows(&filter(None, None).unwrap()), "info");
        assert_eq!(shows(&filter(None, Some("  ")).unwrap()), "info");
        assert_eq!(shows(&filter(None, Some("debug")).unwrap()), "debug");
        assert_eq!(shows(&filter(Some("warn"), Some("debug")).unwrap()), "warn");
        let f = filter(None, Some("scx_zernel::daemon=debug,warn")).unwrap();
        assert!(shows(&f).contains("scx_zernel::daemon=debug"), "{f}");
        // Levels in any case, as log's LevelFilter took them.
        assert!(filter(Some("DEBUG"), None).is_ok());
    }

    #[test]
    fn bad_filters_are_one_line_errors_naming_their_origin() {
        let e = filter(Some("verbose"), None).unwrap_err().to_string();
        assert_eq!(
            e,
            "--log-level 'verbose': 'verbose' is not a level (off, error, warn, info, debug, trace); a target takes one as TARGET=LEVEL"
        );
        let e = filter(None, Some("scx_zernel=loud")).unwrap_err().to_string();
        assert!(e.starts_with("RUST_LOG 'scx_zernel=loud': "), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
