//! Issue 15: how the binary fails. A second `weir serve` on a data dir in use says so on
//! stderr (naming the directory and its `.lock`) and exits non-zero without printing
//! "listening"; a client command pointed at a port nobody listens on fails within its
//! metadata timeout, naming the address.
//!
//! Every child runs under `timeout(1)`; the first broker is a `BinaryBroker` (killed on
//! drop).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{weir_bin, BinaryBroker};

#[test]
fn a_second_serve_on_a_locked_data_dir_fails_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let first = BinaryBroker::spawn(dir.path(), 0, &[]);
    let out = Command::new("timeout")
        .arg("60")
        .arg(weir_bin())
        .arg("serve")
        .args(["--override", "listeners=PLAINTEXT://127.0.0.1:0"])
        .arg("--override")
        .arg(format!("log.dirs={}", dir.path().display()))
        .args(["--override", "admin.listeners=http://127.0.0.1:0"])
        .output()
        .expect("run weir serve");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stdout.contains("listening"), "{stdout}");
    let lock = dir.path().join(".lock");
    assert!(
        stderr.contains(&format!("log.dirs {} is in use", dir.path().display()))
            && stderr.contains(&format!("{} is locked", lock.display())),
        "{stderr}"
    );
    // The first broker was not disturbed.
    assert!(!first.stderr_text().contains("panicked"));
    first.terminate();
}

#[test]
fn client_commands_against_a_closed_port_fail_in_time_naming_the_address() {
    let deadline = Duration::from_secs(40);
    let commands: [&[&str]; 6] = [
        &["topic", "list"],
        &["topic", "describe", "t"],
        &[
            "topic",
            "delete-records",
            "t",
            "--partition",
            "0",
            "--offset",
            "1",
        ],
        &["consume", "t", "-n", "1"],
        &["produce", "t"],
        &["group", "list"],
    ];
    // All at once: each waits out its own metadata timeout.
    let started = Instant::now();
    let children: Vec<_> = commands
        .iter()
        .map(|args| {
            let child = Command::new("timeout")
                .arg(deadline.as_secs().to_string())
                .arg(weir_bin())
                .args(*args)
                .args(["-b", "127.0.0.1:1"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run weir");
            (args, child)
        })
        .collect();
    for (args, child) in children {
        let out = child.wait_with_output().expect("wait for weir");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "weir {args:?}: {stderr}");
        assert!(stderr.contains("127.0.0.1:1"), "weir {args:?}: {stderr}");
    }
    assert!(started.elapsed() < deadline, "took {:?}", started.elapsed());
}
