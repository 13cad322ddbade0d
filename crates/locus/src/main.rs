//! `locus`: one binary for every role (master, worker, local cluster) and the CLI. Each
//! command family lives in a module of `cli`; this file parses the command line, runs
//! the command and turns its error into the exit code.

mod cli;

use anyhow::Result;
use clap::{Parser, Subcommand};

use cli::{Global, admin, bench, fs, local, server};

#[derive(Parser)]
#[command(name = "locus", version, about = "Locus: a data orchestration layer between compute and storage")]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a master.
    Master(server::MasterArgs),
    /// Run a worker.
    Worker(server::WorkerArgs),
    /// Run the S3-compatible gateway (buckets are the top-level directories).
    Gateway(server::GatewayArgs),
    /// Run a whole cluster in this process.
    Local {
        #[command(subcommand)]
        cmd: local::LocalCmd,
    },
    /// File system commands (like `alluxio fs`).
    Fs(fs::FsArgs),
    /// Benchmarks that print medians and ratios measured side by side in one run.
    Bench {
        #[command(subcommand)]
        cmd: bench::BenchCmd,
    },
    /// Workers, capacity and usage per tier, bytes read by source, and the hit ratio.
    Report {
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Fs(_) | Cmd::Report { .. }) {
        // Client commands piped into `head` and the like end quietly when the reader goes
        // away, as other Unix tools do (Rust ignores SIGPIPE, so println! would panic).
        // Servers keep ignoring it: a client hanging up must never kill them.
        // SAFETY: resetting a signal disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let code = match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            let (code, msg) = cli::exit_code(&e);
            eprintln!("locus: {}", msg.lines().next().unwrap_or(""));
            code
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<()> {
    let g = &cli.global;
    match &cli.cmd {
        Cmd::Master(a) => server::master(g, a),
        Cmd::Worker(a) => server::worker(g, a),
        Cmd::Gateway(a) => server::gateway(g, a),
        Cmd::Local { cmd } => local::run(g, cmd),
        Cmd::Fs(a) => fs::run(g, a),
        Cmd::Bench { cmd } => bench::run(cmd),
        Cmd::Report { json } => admin::report(g, *json),
    }
}
