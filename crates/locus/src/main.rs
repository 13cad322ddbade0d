//! `locus`: one binary for every role (master, worker, local cluster) and the CLI. Each
//! command family lives in a module of `cli`; this file parses the command line, runs
//! the command and turns its error into the exit code.

mod cli;

/// Transparent huge pages off for this process (unless `MIMALLOC_ALLOW_THP` says
/// otherwise). mimalloc asks for them on its arenas, and khugepaged then refills the 4 KiB
/// pages mimalloc has given back with whole 2 MiB pages: in the 1-hour soak an idle
/// server's RSS grew 276 -> 314 MiB in 5 minutes, all of it huge pages, and after an
/// import of 3M entries it kept 423 MiB against 278 MiB without them
/// (`bench/results/soak-*.md`).
fn no_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE takes plain integers and changes only this process.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

/// mimalloc rather than the system allocator: the servers and the CLI make many small
/// allocations that other threads free (an import's entries, RPC messages), where glibc
/// spent a third of an import's CPU time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Result;
use clap::{Parser, Subcommand};

use cli::{Global, admin, bench, doctor, fs, fuse, local, server, sql};

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
    /// Mount the namespace as a POSIX file system (FUSE) until Ctrl-C or SIGTERM.
    Fuse(fuse::FuseArgs),
    /// Run SQL over Locus files (CSV, JSON lines, Parquet): FROM 'locus:///logs/*.csv'.
    Sql(sql::SqlArgs),
    /// Benchmarks that print medians and ratios measured side by side in one run.
    Bench {
        #[command(subcommand)]
        cmd: bench::BenchCmd,
    },
    /// Workers, capacity and usage per tier, bytes read by source, and the hit ratio.
    Report {
        /// One JSON object (the same as the status page's /api/report).
        #[arg(long)]
        json: bool,
        /// Only the client reads by client host: bytes by source (short-circuit, local
        /// worker, remote worker, UFS) and the share read short-circuit.
        #[arg(long)]
        by_host: bool,
    },
    /// Cluster administration.
    Admin {
        #[command(subcommand)]
        cmd: AdminCmd,
    },
    /// Check the cluster from this host and say what is wrong and how to fix it (master,
    /// workers, UFS per mount, clocks, free space, open-file limits, the client token,
    /// the local worker and a short-circuit test read); --reads explains recent reads
    /// that were not short-circuit. Exits 1 when a check fails.
    Doctor(doctor::DoctorArgs),
}

#[derive(Subcommand)]
enum AdminCmd {
    /// The members of a replicated master group: list, add, remove.
    Masters {
        #[command(subcommand)]
        cmd: cli::masters::MastersCmd,
    },
}

fn main() {
    no_huge_pages();
    // A build with fault points takes them from `FAILPOINTS` (the fault-point tests run
    // this binary, killed at one).
    #[cfg(feature = "failpoints")]
    let _faults = locus_common::fail::FailScenario::setup();
    let cli = Cli::parse();
    // SIGPIPE stays ignored (Rust's default): a peer that hangs up on one of our sockets
    // is an error to report, never a silent death. Output piped into `head` and the like
    // still ends quietly, as other Unix tools do: a print to a closed stdout exits with
    // the status a SIGPIPE death would give (the streaming commands check for
    // BrokenPipe themselves).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default_hook(info);
    }));
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
        Cmd::Fuse(a) => fuse::run(g, a),
        Cmd::Sql(a) => sql::run(g, a),
        Cmd::Bench { cmd } => bench::run(cmd),
        Cmd::Report { json, by_host } => admin::report(g, *json, *by_host),
        Cmd::Admin { cmd: AdminCmd::Masters { cmd } } => cli::masters::run(g, cmd),
        Cmd::Doctor(a) => doctor::run(g, a),
    }
}
