//! The command line around the daemon, without a kernel: the version banner
//! with the build id, the log filter's errors, the scx options in --help,
//! bad libbpf options refused before anything is loaded, and the config
//! ownership rules for root.

use std::process::Command;

mod common;

fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_scx_zernel"));
    c.args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn version_has_the_build_id() {
    let (ok, out, _) = run(&["--version"], &[]);
    assert!(ok);
    // "scx_zernel 0.1.0-g<commit> <target triple>", as the scx schedulers print it.
    let v = out.trim().strip_prefix("scx_zernel ").unwrap_or_else(|| panic!("{out}"));
    assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
    assert!(v.contains("-linux-"), "no target triple in {v}");
    if std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.git")).exists() {
        assert!(v.contains("-g"), "no commit in {v}");
    }
}

#[test]
fn bad_log_filters_are_one_line_errors() {
    let (ok, _, err) = run(&["--log-level", "verbose", "--dump-config"], &[]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("scx_zernel: --log-level 'verbose': 'verbose' is not a level"), "{err}");

    let (ok, _, err) = run(&["--dump-config"], &[("RUST_LOG", "scx_zernel=loud")]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("scx_zernel: RUST_LOG 'scx_zernel=loud': "), "{err}");

    // Good ones, either way.
    assert!(run(&["--log-level", "scx_zernel=debug,warn", "--dump-config"], &[]).0);
    assert!(run(&["--log-format", "json", "--dump-config"], &[("RUST_LOG", "debug")]).0);
    let (ok, _, err) = run(&["--log-format", "yaml", "--dump-config"], &[]);
    assert!(!ok && err.contains("--log-format"), "{err}");
}

#[test]
fn help_documents_the_scx_options() {
    let (_, help, _) = run(&["--help"], &[]);
    for flag in [
        "--exit-dump-len <BYTES>",
        "--log-level <FILTER>",
        "RUST_LOG",
        "--log-format <FORMAT>",
        "libbpf options",
        "--relaxed-maps",
        "--pin-root-path",
        "--kconfig",
        "--btf-custom-path",
        "--bpf-token-path",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn an_unreadable_kconfig_is_refused_before_loading() {
    let (ok, _, err) = run(&["--kconfig", "/nonexistent/kconfig"], &[]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--kconfig /nonexistent/kconfig: cannot read"), "{err}");
}

/// As root (CI runs as root): `sudo scx_zernel --config FILE` with the sudo
/// user's own file is accepted with a warning; anyone else's, a file others
/// can write, or one in a directory others can write, is refused in one line.
#[test]
fn config_ownership_as_root() {
    use std::os::unix::fs::{chown, PermissionsExt};
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root");
        return;
    }
    let tmp = common::TempDir::new("owner");
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = dir.join("zernel.toml");
    std::fs::write(&cfg, "").unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    chown(&cfg, Some(1000), Some(1000)).unwrap();
    let path = cfg.to_str().unwrap();
    let args = ["--config", path, "--dump-config"];

    let (ok, _, err) = run(&args, &[("SUDO_UID", "1000")]);
    assert!(ok, "{err}");
    assert!(err.contains(&format!("{path}: owned by uid 1000, the user who ran sudo, not root")), "{err}");

    let (ok, _, err) = run(&args, &[("SUDO_UID", "1001")]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("{path}: refusing a config file owned by uid 1000, neither root nor")), "{err}");

    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o664)).unwrap();
    let (ok, _, err) = run(&args, &[("SUDO_UID", "1000")]);
    assert!(!ok && err.contains("writable by group or others (mode 664)"), "{err}");

    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, _, err) = run(&args, &[("SUDO_UID", "1000")]);
    assert!(!ok && err.contains("directory writable by group or others without the sticky bit"), "{err}");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(run(&args, &[("SUDO_UID", "1000")]).0);
}
