//! An interrupted run leaves nothing behind: no temporary file, no archive under the final
//! name, and the input untouched.

#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn sigint_and_sigterm_during_compress_remove_the_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let bin = env!("CARGO_BIN_EXE_hypercodec");
    // 48 tensors of 256×512: codebook training takes seconds over all of them.
    let st = Command::new(bin)
        .args([
            "synth",
            model.to_str().unwrap(),
            "--shape",
            "256x512",
            "--tensors",
            "48",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    for (signal, code) in [("-INT", 130), ("-TERM", 143), ("-HUP", 129)] {
        let out = dir.path().join("m.hwz");
        let child = Command::new(bin)
            .args([
                "compress",
                model.to_str().unwrap(),
                out.to_str().unwrap(),
                "--encoding",
                "codebook",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the temporary archive exists, so the signal lands mid-run.
        let start = Instant::now();
        let temp_seen = loop {
            let temps = std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"));
            if temps || start.elapsed() > Duration::from_secs(30) {
                break temps;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(temp_seen, "no temporary file appeared");
        std::thread::sleep(Duration::from_millis(200));
        let kill = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let output = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        // 128 + the signal's number, as a shell reports a process that signal ended.
        assert_eq!(output.status.code(), Some(code), "{signal}: {err}");
        assert!(err.contains("cancelled"), "{signal}: {err}");
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec!["m.safetensors".to_string()], "{signal}");
    }
}
