//! `vnic`: the vhost-user virtio-net device daemon and its control client.

use std::process::ExitCode;

use clap::Parser;
use vnic::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let r = match cli.command {
        Command::Serve(args) => vnic::cli::serve(args).map_err(|e| e.to_string()),
        Command::Ctl(args) => vnic::cli::run_ctl(&args).map_err(|e| e.to_string()),
        Command::Trace(args) => vnic_trace::run(&args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vnic: error: {e}");
            ExitCode::FAILURE
        }
    }
}
