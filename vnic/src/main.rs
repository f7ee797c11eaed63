//! `vnic`: the vhost-user virtio-net device daemon and its control client.

use std::process::ExitCode;

use clap::Parser;
use vnic::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // Each subcommand's own error type; here they are only printed.
    let r: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Serve(args) => vnic::cli::serve(args).map_err(Into::into),
        Command::Ctl(args) => vnic::cli::run_ctl(&args).map_err(Into::into),
        Command::Trace(args) => vnic_trace::run(&args).map_err(Into::into),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vnic: error: {e}");
            ExitCode::FAILURE
        }
    }
}
