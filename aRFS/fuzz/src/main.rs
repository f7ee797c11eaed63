//! `arfs-fuzz`: the fuzz targets of crate `arfs-fuzz` on stable Rust, with
//! no libFuzzer and no coverage feedback: each target body runs over its
//! corpus, then over inputs mutated from it (bit flips, interesting
//! values, inserts, deletes, splices, dictionary tokens) until its time is
//! up. Every input is a function of the seed, the corpus and the
//! iteration number, so a run is replayed exactly with `--seed S --iters
//! N`. A crash (panic) or a hang stops the target, saves the input under
//! `--artifacts DIR/TARGET/` and fails the run; `--repro TARGET FILE`
//! runs one saved input again. See `aRFS/fuzz/README.md`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arfs_fuzz::{json_dict, Target, TARGETS};
use clap::Parser;

const USAGE: &str = "arfs-fuzz [--seconds N | --iters N] [--seed S] [--corpus DIR] \
[--artifacts DIR] [--max-len N] [TARGET...]\n       arfs-fuzz --repro TARGET FILE\n       arfs-fuzz --list";

// The command line. `--list` and `--repro` leave the other options
// unused; a repeated option takes its last value.
#[derive(Parser)]
#[command(
    name = "arfs-fuzz",
    about = "The fuzz targets of arfs-fuzz on stable Rust: the corpus, then mutants of it, per target",
    override_usage = USAGE,
    after_help = targets_help(),
    args_override_self = true
)]
struct Cli {
    /// Seconds per target
    #[arg(long, value_name = "N", default_value = "60")]
    seconds: f64,
    /// Exactly N inputs per target, instead of --seconds
    #[arg(long, value_name = "N")]
    iters: Option<u64>,
    /// Seed of the mutations, decimal or 0x hex (default: from the clock; always printed)
    #[arg(long, value_name = "S", value_parser = seed)]
    seed: Option<u64>,
    /// The corpus: DIR/TARGET/ per target (plus the committed regressions/TARGET/)
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus"))]
    corpus: PathBuf,
    /// Where a crashing or hanging input is saved (DIR/TARGET/)
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/artifacts"))]
    artifacts: PathBuf,
    /// Longest mutant, in bytes
    #[arg(long, value_name = "N", default_value = "4096")]
    max_len: usize,
    /// Print the targets' names and exit
    #[arg(long)]
    list: bool,
    /// Run one saved input through TARGET once (a crash shows with its backtrace)
    #[arg(long, num_args = 2, value_names = ["TARGET", "FILE"])]
    repro: Option<Vec<String>>,
    /// The targets to fuzz, in turn (default: all)
    #[arg(value_name = "TARGET", value_parser = target)]
    targets: Vec<&'static Target>,
}

// A String: a clap value_parser, whose error clap prints as the option's.
fn seed(v: &str) -> Result<u64, String> {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    }
    .map_err(|e| format!("--seed {v}: {e}"))
}

fn targets_help() -> String {
    let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
    format!("targets: {} (default: all)", names.join(" "))
}

/// A hang: one input running this long.
const HANG: Duration = Duration::from_secs(10);

struct Opts {
    seconds: f64,
    iters: Option<u64>,
    seed: u64,
    corpus: PathBuf,
    artifacts: PathBuf,
    max_len: usize,
    targets: Vec<&'static Target>,
}

// A String: a clap value_parser too (and `--repro`'s check, printed by main).
fn target(name: &str) -> Result<&'static Target, String> {
    TARGETS
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| format!("unknown target {name:?}\n{}", targets_help()))
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("arfs-fuzz: {e}");
            ExitCode::from(2)
        }
    }
}

/// Why a fuzz run could not run (a crash or hang is a result, not this).
#[derive(Debug, thiserror::Error)]
enum FuzzError {
    /// `--repro`'s target name (the value parser's message).
    #[error("{0}")]
    Target(String),
    /// A file to replay or a corpus file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A target's corpus directory cannot be listed.
    #[error("corpus {}: {source} (write it with: python3 aRFS/fuzz/seed.py)", dir.display())]
    Corpus {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("corpus {} is empty", dir.display())]
    EmptyCorpus { dir: PathBuf },
}

fn run() -> Result<bool, FuzzError> {
    let cli = Cli::parse();
    if cli.list {
        for t in TARGETS {
            println!("{}", t.name);
        }
        return Ok(true);
    }
    if let Some([name, file]) = cli.repro.as_deref() {
        let t = target(name).map_err(FuzzError::Target)?;
        let data = std::fs::read(file).map_err(|source| FuzzError::Read {
            path: file.into(),
            source,
        })?;
        println!("{}: running {file} ({} bytes)", t.name, data.len());
        (t.run)(&data); // a crash shows with its backtrace
        println!("{}: {file} passed", t.name);
        return Ok(true);
    }
    let o = Opts {
        seconds: cli.seconds,
        iters: cli.iters,
        seed: cli.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        }),
        corpus: cli.corpus,
        artifacts: cli.artifacts,
        max_len: cli.max_len,
        targets: if cli.targets.is_empty() {
            TARGETS.iter().collect()
        } else {
            cli.targets
        },
    };
    println!(
        "arfs-fuzz: seed 0x{:016x} ({}; replay: --seed 0x{:016x} --iters N)",
        o.seed,
        o.iters.map_or_else(
            || format!("{} s per target", o.seconds),
            |n| format!("{n} inputs per target")
        ),
        o.seed
    );
    install_panic_hook();
    let mut ok = true;
    for t in &o.targets {
        ok &= fuzz(t, &o)?;
    }
    Ok(ok)
}

/// The message of the last panic (the default hook would print every
/// caught one).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let mut m = LAST_PANIC
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m = info.to_string();
    }));
}

/// The corpus of one target: the files of `DIR/TARGET/` and of the
/// committed `regressions/TARGET/` (findings), by name.
fn load_corpus(dir: &Path, regressions: &Path) -> Result<Vec<(String, Vec<u8>)>, FuzzError> {
    let rd = std::fs::read_dir(dir).map_err(|source| FuzzError::Corpus {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .chain(std::fs::read_dir(regressions).into_iter().flatten())
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).map_err(|source| FuzzError::Read {
                path: p.clone(),
                source,
            })?;
            Ok((
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                data,
            ))
        })
        .collect()
}

/// FNV-1a, for artifact names.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn save(o: &Opts, t: &Target, kind: &str, data: &[u8]) -> PathBuf {
    let dir = o.artifacts.join(t.name);
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(format!("{kind}-{:016x}", fnv(data)));
    if let Err(e) = std::fs::write(&p, data) {
        eprintln!("arfs-fuzz: cannot save {}: {e}", p.display());
    }
    p
}

/// Fuzz one target; false on a crash or hang.
fn fuzz(t: &'static Target, o: &Opts) -> Result<bool, FuzzError> {
    let regressions = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let corpus = load_corpus(&o.corpus.join(t.name), &regressions.join(t.name))?;
    if corpus.is_empty() {
        return Err(FuzzError::EmptyCorpus {
            dir: o.corpus.join(t.name),
        });
    }
    // The input running now and the executions so far, for the hang watchdog.
    let current = Arc::new(Mutex::new(Vec::<u8>::new()));
    let execs = Arc::new(AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (current, execs, done) = (current.clone(), execs.clone(), done.clone());
        let (artifacts, name, seed) = (o.artifacts.clone(), t.name, o.seed);
        std::thread::spawn(move || {
            let mut last = (u64::MAX, Instant::now());
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let n = execs.load(Ordering::Relaxed);
                if n != last.0 {
                    last = (n, Instant::now());
                } else if last.1.elapsed() > HANG {
                    let data = current.lock().map(|d| d.clone()).unwrap_or_default();
                    let dir = artifacts.join(name);
                    let _ = std::fs::create_dir_all(&dir);
                    let p = dir.join(format!("hang-{:016x}", fnv(&data)));
                    let _ = std::fs::write(&p, &data);
                    println!(
                        "target {name}: HANG: input {n} (seed 0x{seed:016x}) ran over {HANG:?}; saved {}",
                        p.display()
                    );
                    std::process::exit(1);
                }
            }
        })
    };
    let mut rng = Rng::new(o.seed ^ fnv(t.name.as_bytes()));
    let dict: Vec<&[u8]> = t
        .dict
        .iter()
        .chain(if t.dict.is_empty() {
            [].iter()
        } else {
            json_dict().iter()
        })
        .map(|s| s.as_bytes())
        .collect();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(o.seconds);
    let mut input = Vec::new();
    let mut n: u64 = 0;
    let mut crash = None;
    // Of every input run, in order: equal digests, equal inputs (a replay
    // with the same seed, corpus and --iters shows the same).
    let mut digest: u64 = 0;
    loop {
        match o.iters {
            Some(max) if n >= max => break,
            None if n >= corpus.len() as u64
                && n.is_multiple_of(64)
                && Instant::now() >= deadline =>
            {
                break
            }
            _ => {}
        }
        // The corpus first, as it is; then mutants.
        input.clear();
        if let Some((_, c)) = corpus.get(n as usize) {
            input.extend_from_slice(c);
        } else {
            let base = &corpus[rng.below(corpus.len())].1;
            input.extend_from_slice(base);
            for _ in 0..=rng.below(4) {
                mutate(&mut input, &mut rng, &corpus, &dict, o.max_len);
            }
        }
        current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone_from(&input);
        digest = (digest ^ fnv(&input)).wrapping_mul(0x0100_0000_01b3);
        let r = std::panic::catch_unwind(|| (t.run)(&input));
        n += 1;
        execs.store(n, Ordering::Relaxed);
        if r.is_err() {
            crash = Some(n - 1);
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "target {}: {n} executions in {secs:.1} s ({:.0}/s), corpus {} inputs, crashes {} (inputs digest {digest:016x})",
        t.name,
        n as f64 / secs.max(1e-9),
        corpus.len(),
        u32::from(crash.is_some())
    );
    if let Some(i) = crash {
        let p = save(o, t, "crash", &input);
        let msg = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
        println!(
            "target {}: CRASH on input {i} (seed 0x{:016x}; replay: arfs-fuzz --seed 0x{:016x} --iters {} {}), saved {}\n  {msg}\n  reproduce: cargo run -p arfs-fuzz -- --repro {} {}",
            t.name,
            o.seed,
            o.seed,
            i + 1,
            t.name,
            p.display(),
            t.name,
            p.display()
        );
        return Ok(false);
    }
    Ok(true)
}

/// xorshift64*: small, fast, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform-ish in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x8000_0000,
    0xffff_ffff,
];

/// One mutation of `d` in place, keeping it at most `max` bytes.
fn mutate(
    d: &mut Vec<u8>,
    rng: &mut Rng,
    corpus: &[(String, Vec<u8>)],
    dict: &[&[u8]],
    max: usize,
) {
    let pos = |rng: &mut Rng, d: &Vec<u8>| rng.below(d.len() + 1);
    match rng.below(if dict.is_empty() { 9 } else { 11 }) {
        0 if !d.is_empty() => {
            let i = rng.below(d.len());
            d[i] ^= 1 << rng.below(8);
        }
        1 if !d.is_empty() => {
            let i = rng.below(d.len());
            d[i] = rng.next() as u8;
        }
        2 if !d.is_empty() => {
            // an interesting value, 1, 2 or 4 bytes, either byte order
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let w = [1, 2, 4][rng.below(3)];
            let (be, le) = (v.to_be_bytes(), v.to_le_bytes());
            let bytes = if rng.below(2) == 0 {
                &be[8 - w..]
            } else {
                &le[..w]
            };
            let i = rng.below(d.len());
            for (k, b) in bytes.iter().enumerate() {
                if let Some(x) = d.get_mut(i + k) {
                    *x = *b;
                }
            }
        }
        3 if !d.is_empty() => {
            // delete a range
            let i = rng.below(d.len());
            let n = 1 + rng.below((d.len() - i).min(16));
            d.drain(i..i + n);
        }
        4 => {
            // insert random bytes
            let i = pos(rng, d);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            d.splice(i..i, bytes);
        }
        5 if !d.is_empty() => {
            // duplicate a range
            let i = rng.below(d.len());
            let n = 1 + rng.below((d.len() - i).min(32));
            let part = d[i..i + n].to_vec();
            let j = pos(rng, d);
            d.splice(j..j, part);
        }
        6 => {
            // splice: our head, another input's tail
            let other = &corpus[rng.below(corpus.len())].1;
            let i = pos(rng, d);
            let j = rng.below(other.len() + 1);
            d.truncate(i);
            d.extend_from_slice(&other[j..]);
        }
        7 if !d.is_empty() => {
            d.truncate(rng.below(d.len()));
        }
        8 if d.len() >= 2 => {
            // add or subtract a little from one byte
            let i = rng.below(d.len());
            let delta = 1 + rng.below(16) as u8;
            d[i] = if rng.below(2) == 0 {
                d[i].wrapping_add(delta)
            } else {
                d[i].wrapping_sub(delta)
            };
        }
        9 | 10 if !dict.is_empty() => {
            // insert or overwrite with a dictionary token
            let tok = dict[rng.below(dict.len())];
            let i = pos(rng, d);
            if rng.below(2) == 0 || i == d.len() {
                d.splice(i..i, tok.iter().copied());
            } else {
                let end = (i + tok.len()).min(d.len());
                d.splice(i..end, tok.iter().copied());
            }
        }
        _ => {
            let i = pos(rng, d);
            d.insert(i, rng.next() as u8);
        }
    }
    d.truncate(max);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `line` split at white space.
    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("arfs-fuzz").chain(line.split_whitespace()))
    }

    fn names(c: &Cli) -> Vec<&'static str> {
        c.targets.iter().map(|t| t.name).collect()
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert!((c.seconds - 60.0).abs() < f64::EPSILON);
        assert_eq!((c.iters, c.seed, c.max_len), (None, None, 4096));
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        assert_eq!(c.corpus, here.join("corpus"));
        assert_eq!(c.artifacts, here.join("artifacts"));
        assert!(!c.list && c.repro.is_none() && c.targets.is_empty());
    }

    #[test]
    fn scripts_test_and_readme_command_lines() {
        // scripts/test: --seconds 5 (--quick) or 60, --seed $VNIC_FUZZ_SEED
        let c = parse("--seconds 5").unwrap();
        assert!((c.seconds - 5.0).abs() < f64::EPSILON);
        let c = parse("--seconds 60 --seed 12345").unwrap();
        assert!((c.seconds - 60.0).abs() < f64::EPSILON);
        assert_eq!(c.seed, Some(12345));
        // aRFS/fuzz/README.md
        let c = parse("--seconds 300 ctl_request").unwrap();
        assert_eq!(names(&c), ["ctl_request"]);
        assert!(parse("--list").unwrap().list);
        let c = parse("--seed 0x0000000000000001 --iters 538504 agent_request").unwrap();
        assert_eq!((c.seed, c.iters), (Some(1), Some(538_504)));
        assert_eq!(names(&c), ["agent_request"]);
        let c = parse("--repro agent_request aRFS/fuzz/artifacts/agent_request/crash-1").unwrap();
        assert_eq!(
            c.repro.as_deref(),
            Some(
                &[
                    "agent_request".into(),
                    "aRFS/fuzz/artifacts/agent_request/crash-1".into()
                ][..]
            )
        );
        let c = parse("--corpus /c --artifacts /a --max-len 64 decode_frame table_ops --seed 0xff")
            .unwrap();
        assert_eq!(names(&c), ["decode_frame", "table_ops"]);
        assert_eq!((c.max_len, c.seed), (64, Some(255)));
        assert_eq!((c.corpus, c.artifacts), ("/c".into(), "/a".into()));
    }

    #[test]
    fn bad_values_are_refused() {
        for (bad, msg) in [
            ("no_such_target", "unknown target \"no_such_target\""),
            ("--seed 0xzz", "--seed 0xzz: invalid digit"),
            ("--seed -1", ""),
            ("--seconds soon", "invalid float literal"),
            ("--iters 1.5", "invalid digit"),
            ("--max-len", "a value is required"),
            ("--repro decode_frame", "2 values required"),
            ("--frobnicate", "unexpected argument"),
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            assert!(e.to_string().contains(msg), "{bad:?}: {e}");
        }
    }
}
