//! `weir serve` with bad configuration: a clear error naming the key, a non-zero exit,
//! and no "listening" line from a broker that is about to exit.

use std::process::Command;

fn serve(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("timeout")
        .arg("30")
        .arg(crate::harness::weir_bin())
        .arg("serve")
        .args(args)
        .output()
        .expect("run weir");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_config_names_the_key_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("weir.toml");
    std::fs::write(&file, "log.dirs = \"x\"\nno.such.key = 1\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--override".into(), "num.partitions=0".into()],
            "num.partitions",
        ),
        (
            vec!["--override".into(), "message.max.bytes=lots".into()],
            "message.max.bytes",
        ),
        (
            vec!["--override".into(), "listeners=9092".into()],
            "listeners",
        ),
        (vec!["--override".into(), "nonsense".into()], "nonsense"),
        (
            vec!["--config".into(), file.display().to_string()],
            "no.such.key",
        ),
        (
            vec![
                "--config".into(),
                dir.path().join("missing.toml").display().to_string(),
            ],
            "missing.toml",
        ),
        (
            vec![
                "--override".into(),
                "listeners=PLAINTEXT://127.0.0.1:0".into(),
                "--override".into(),
                "log.dirs=/proc/weir-cannot-be-here".into(),
            ],
            "log.dirs",
        ),
    ];
    for (args, key) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = serve(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(
            stderr.contains(key),
            "{args:?}: error does not name {key}: {stderr}"
        );
        assert!(
            !stdout.contains("listening"),
            "{args:?}: announced a listener: {stdout}"
        );
    }
}

#[test]
fn the_shipped_config_file_starts_a_broker() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = crate::harness::repo_root().join("config/weir.toml");
    let mut child = Command::new(crate::harness::weir_bin())
        .args(["serve", "--config"])
        .arg(&shipped)
        .arg("--override")
        .arg("listeners=PLAINTEXT://127.0.0.1:0")
        .arg("--override")
        .arg("admin.listeners=http://127.0.0.1:0")
        .arg("--override")
        .arg(format!("log.dirs={}", dir.path().display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("weir listening on 127.0.0.1:"), "{line:?}");
}
