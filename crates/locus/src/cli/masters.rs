//! `locus admin masters`: the members of a replicated master group, and changing them.
//! Changes prove the master's role with the cluster secret (`security.secret_file`), so
//! they run on a master's host; the client token may only list.

use anyhow::{Context, Result};
use clap::Subcommand;
use locus_common::security::{Identity, Role};
use locus_proto::pb;

use super::{Global, runtime};

#[derive(Subcommand)]
pub enum MastersCmd {
    /// The group's members: raft and RPC address, voter or learner, the leader.
    List,
    /// Add the master at RAFT_ADDRESS (started with --raft-address RAFT_ADDRESS and
    /// --peers naming the group): it is sent the namespace, then votes.
    Add { raft_address: String },
    /// Remove the member at RAFT_ADDRESS (a dead one, before its replacement is added).
    Remove { raft_address: String },
}

pub fn run(g: &Global, cmd: &MastersCmd) -> Result<()> {
    let cfg = g.load_config([])?;
    runtime()?.block_on(async move {
        let r = match cmd {
            MastersCmd::List => super::client(&cfg)?.masters().await?,
            MastersCmd::Add { raft_address } => member_client(&cfg)?.add_master(raft_address).await?,
            MastersCmd::Remove { raft_address } => member_client(&cfg)?.remove_master(raft_address).await?,
        };
        print_members(&r);
        Ok(())
    })
}

/// A client proving the master's role with the cluster secret.
fn member_client(cfg: &locus_common::config::Config) -> Result<locus_client::Client> {
    let secret = locus_common::security::read_secret_file(&cfg.security.secret_file).with_context(|| {
        format!(
            "changing the masters needs the cluster secret ({}): run it on a master's host, or set \
             security.secret_file",
            cfg.security.secret_file.display()
        )
    })?;
    let tls = locus_client::Tls::load(&cfg.security)?;
    let id = Identity::member(&secret, Role::Master);
    Ok(locus_client::Client::with_identity(&cfg.master_address, cfg.client.clone(), id, tls)?)
}

fn print_members(r: &pb::MasterGroupStatus) {
    println!("term {}", r.term);
    println!("{:<24} {:<24} role", "raft address", "rpc address");
    for m in &r.masters {
        let role = if m.voter { "voter" } else { "learner" };
        println!("{:<24} {:<24} {:<8} {}", m.raft_address, m.rpc_address, role, if m.leader { "leader" } else { "" });
    }
}
