//! vnic-agent: the guest side of the vnic guest test suite.
//!
//! Runs inside the guest as `/sbin/vnic-agent`, usually exec'ed by the
//! initramfs' `/init` (so it is PID 1: it never exits on its own and turns a
//! fatal error into a power-off). It serves newline-delimited JSON requests
//! (see `vnic_agent::proto`) on the virtio-serial port named `vnic.agent`.
//!
//! Options (clap, [`Cli`]): `--port PATH` uses PATH instead of looking the
//! port up by name. A bad command line takes the fatal path too (a
//! power-off when PID 1), never a plain exit.

mod netlink;
mod rawtx;
mod sys;
mod workload;

use clap::Parser;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vnic_agent::proto::{Envelope, Reply, Request, PORT_NAME};

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "vnic-agent",
    override_usage = "vnic-agent [--port PATH]",
    about = format!(
        "Serves the vnic guest-test protocol (JSON lines) on the virtio-serial port named \
         {PORT_NAME} (or --port PATH)."
    )
)]
struct Cli {
    /// Serve on PATH instead of looking the virtio-serial port up by its
    /// name
    #[arg(long, value_name = "PATH")]
    port: Option<PathBuf>,
}

fn log(msg: &str) {
    eprintln!("vnic-agent: {msg}");
}

/// Find `/dev/vportNpM` whose sysfs name is `vnic.agent`, waiting up to
/// `wait` for udev-less devtmpfs to show it.
fn find_port(wait: Duration) -> Option<PathBuf> {
    let deadline = Instant::now() + wait;
    loop {
        if let Ok(dir) = std::fs::read_dir("/sys/class/virtio-ports") {
            for ent in dir.flatten() {
                let name = std::fs::read_to_string(ent.path().join("name")).unwrap_or_default();
                if name.trim() == PORT_NAME {
                    let dev = PathBuf::from("/dev").join(ent.file_name());
                    if dev.exists() {
                        return Some(dev);
                    }
                }
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn fatal(msg: &str) -> ! {
    log(msg);
    if std::process::id() == 1 {
        // PID 1 must not exit (the kernel would panic): power off instead.
        std::thread::sleep(Duration::from_secs(1));
        sys::poweroff();
    }
    std::process::exit(1);
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help: clap's "error" is the text to print on stdout, and the
        // agent returns as from any run that ends.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return;
        }
        // Not exit(2) as clap would: PID 1 must power off instead.
        Err(e) => fatal(e.to_string().trim_end()),
    };
    let Some(port) = cli.port.or_else(|| find_port(Duration::from_secs(20))) else {
        fatal(&format!("no virtio-serial port named {PORT_NAME}"))
    };
    let file = match OpenOptions::new().read(true).write(true).open(&port) {
        Ok(f) => f,
        Err(e) => fatal(&format!("open {}: {e}", port.display())),
    };
    log(&format!("serving on {}", port.display()));
    let writer = file
        .try_clone()
        .unwrap_or_else(|e| fatal(&format!("dup port: {e}")));
    serve(BufReader::new(file), writer);
}

fn serve(mut reader: BufReader<File>, mut writer: File) -> ! {
    let mut state = workload::State::default();
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            // No host connected yet (or it went away): the port reads as EOF.
            Ok(0) => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                log(&format!("read: {e}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let (reply, then_poweroff) = match serde_json::from_str::<Envelope>(text) {
            Err(e) => (
                Reply {
                    id: id_of(text),
                    result: None,
                    error: Some(format!("bad request: {e}")),
                },
                false,
            ),
            Ok(env) => {
                let poweroff = matches!(env.req, Request::Poweroff);
                // A bug in one handler must not take PID 1 (and the guest) down.
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    workload::handle(&mut state, env.req)
                }));
                // The protocol boundary: a handler's error becomes its text.
                let (result, error) = match res {
                    Ok(Ok(v)) => (Some(v), None),
                    Ok(Err(e)) => (None, Some(e.to_string())),
                    Err(_) => (None, Some("agent handler panicked".to_string())),
                };
                (
                    Reply {
                        id: env.id,
                        result,
                        error,
                    },
                    poweroff,
                )
            }
        };
        let mut out = serde_json::to_string(&reply).unwrap_or_else(|e| {
            format!(
                "{{\"id\":{},\"error\":\"cannot encode reply: {e}\"}}",
                reply.id
            )
        });
        out.push('\n');
        if let Err(e) = writer
            .write_all(out.as_bytes())
            .and_then(|()| writer.flush())
        {
            log(&format!("write reply: {e}"));
        }
        if then_poweroff {
            state.stop_all();
            std::thread::sleep(Duration::from_millis(200));
            sys::poweroff();
        }
    }
}

/// Best effort: the id of a request that did not parse, so the harness can
/// still match the error to its request.
fn id_of(text: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("id").and_then(serde_json::Value::as_u64))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::{CommandFactory, Parser};
    use std::path::Path;

    #[test]
    fn command_line() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["vnic-agent", "--port", "/x"]).unwrap();
        assert_eq!(cli.port.as_deref(), Some(Path::new("/x")));
        assert_eq!(Cli::try_parse_from(["vnic-agent"]).unwrap().port, None);
        let e = Cli::try_parse_from(["vnic-agent", "--frobnicate"]).unwrap_err();
        assert!(e.use_stderr(), "{e}");
        assert!(e.to_string().contains("--frobnicate"), "{e}");
        // --port needs its PATH.
        assert!(Cli::try_parse_from(["vnic-agent", "--port"]).is_err());
        // --help is no error to act on: main prints it and returns.
        let h = Cli::try_parse_from(["vnic-agent", "--help"]).unwrap_err();
        assert!(!h.use_stderr());
        let text = h.to_string();
        assert!(
            text.contains("virtio-serial port named vnic.agent (or --port PATH)"),
            "{text}"
        );
    }
}
