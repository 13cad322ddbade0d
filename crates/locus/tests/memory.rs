//! The cluster's live heap under a steady load: it levels off, it does not grow with the
//! number of operations served (issue 54, finding 10). The whole process's allocations
//! are counted by a wrapper around the system allocator, so a leak anywhere (master,
//! worker, client, caches that never shed) shows, while allocator retention (freed memory
//! an allocator keeps) does not: that is what `bench/run soak` measures, as RSS.
#![allow(clippy::unwrap_used)] // a test that cannot go on fails

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use locus_client::{Client, ReadOptions};
use locus_common::config::{ClientConfig, WriteType};
use locus_proto::pb;

mod common;
use common::{put_as, random, start, wait_queue_empty};

/// Bytes allocated and not yet freed, by the whole test process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call goes to `System` unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The tests of this file one at a time: the counter is the whole process's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const FILES: usize = 40;
const OPS: usize = 400;

/// One round of the mixed load on a fixed set of names: writes of each write type,
/// reads, stats, listings, renames, metadata updates, searches, deletes and directories.
async fn round(c: &Client, round: usize) {
    for i in 0..OPS {
        let f = format!("/mem/d{}/f{:02}", i % 4, (i * 7 + round) % FILES);
        match i % 10 {
            0..=2 => {
                let wt = [WriteType::MustCache, WriteType::CacheThrough, WriteType::AsyncThrough][i % 3];
                let data = random(1 + (i * 977) % (96 << 10));
                put_as(c, &f, &data, wt).await.unwrap();
            }
            3 | 4 => {
                if let Ok(fi) = c.status(&f, true).await {
                    let mut out = Vec::new();
                    c.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
                    assert_eq!(out.len() as u64, fi.length);
                }
            }
            5 => {
                c.list_page(&format!("/mem/d{}", i % 4), "", false, 0).await.unwrap();
            }
            6 => {
                let to = format!("{f}.moved");
                if c.rename(&f, &to).await.is_ok() {
                    c.rename(&to, &f).await.unwrap();
                }
            }
            7 => {
                let meta = pb::ObjectMeta {
                    user: [("color".to_string(), format!("c{}", i % 5))].into(),
                    ..Default::default()
                };
                let _ = c.set_object_meta(&f, meta, false).await;
                let q = pb::SearchRequest {
                    path: "/mem".into(),
                    r#where: "x-amz-meta-color = c1".into(),
                    ..Default::default()
                };
                c.search(q).await.unwrap();
            }
            8 => {
                let _ = c.delete(&f, false).await;
            }
            _ => {
                let d = format!("/mem/tmp{}/a/b", i % 3);
                c.mkdir(&d, true).await.unwrap();
                c.delete(&format!("/mem/tmp{}", i % 3), true).await.unwrap();
            }
        }
    }
}

/// The live heap once the background work of the last round (persists, heartbeats,
/// index commits) has run: the lowest of a few readings a heartbeat apart.
async fn live_after(c: &Client) -> isize {
    wait_queue_empty(c, Duration::from_secs(30)).await;
    let mut low = isize::MAX;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        low = low.min(LIVE.load(Ordering::Relaxed));
    }
    low
}

/// A cluster of `workers` with a MEM tier of `mem` bytes each, and a client of it.
async fn cluster(workers: usize, mem: u64) -> (tempfile::TempDir, locus_cluster::LocalCluster, Client) {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), workers, mem, false).await;
    let client = c.client(ClientConfig::default()).unwrap();
    (dir, c, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_heap_levels_off_under_a_steady_load() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (_dir, _c, client) = cluster(2, 256 << 20).await;
    client.mkdir("/mem", true).await.unwrap();

    // Warm-up: connection pools, caches, the search index and redb's pages fill.
    for r in 0..3 {
        round(&client, r).await;
    }
    // Then the live heap after each of 8 rounds; a leak shows as the last three above
    // the first three (bounded structures that are still filling, such as the record
    // of finished UFS changes, add a few KiB a round).
    let rounds: usize = std::env::var("LOCUS_MEMORY_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(8).max(6);
    let mut seen = Vec::new();
    for r in 3..3 + rounds {
        round(&client, r).await;
        seen.push(live_after(&client).await);
    }
    let mib = |b: f64| b / (1 << 20) as f64;
    let mean = |s: &[isize]| s.iter().sum::<isize>() as f64 / s.len() as f64;
    let growth = mean(&seen[rounds - 3..]) - mean(&seen[..3]);
    let ops = (rounds - 3) * OPS;
    eprintln!(
        "live heap after each round (MiB): {:?}; grew {:.2} MiB over {ops} operations ({:.0} B each)",
        seen.iter().map(|&b| format!("{:.2}", mib(b as f64))).collect::<Vec<_>>(),
        mib(growth),
        growth / ops as f64
    );
    // A leak of 512 B per operation would be 1 MiB here; tantivy's delete queue alone
    // kept 1.3 KiB per delete before the writer was renewed (`RENEW_AFTER_DELETES`).
    assert!(growth < (1 << 20) as f64, "the live heap grew {:.2} MiB over {ops} operations", mib(growth));
}

const TREES: usize = 400;

/// A namespace where directories come and go all day (a job's `_temporary` trees): the
/// search index's writer kept every delete it was given, about 1.5 KiB each, until it
/// was renewed every `RENEW_AFTER_DELETES` deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_trees_all_day_keeps_nothing() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (_dir, _c, client) = cluster(1, 64 << 20).await;
    async fn churn(client: &Client, r: usize) {
        for i in 0..TREES {
            let t = format!("/job/_temporary/{}", (r * TREES + i) % 50);
            client.mkdir(&format!("{t}/attempt/part"), true).await.unwrap();
            client.delete(&t, true).await.unwrap();
        }
    }
    churn(&client, 0).await;
    let mut seen = Vec::new();
    for r in 1..6 {
        churn(&client, r).await;
        seen.push(live_after(&client).await);
    }
    let growth = (seen[4] + seen[3] - seen[0] - seen[1]) as f64 / 2.0 / (1 << 20) as f64;
    eprintln!("live heap after each round (B): {seen:?}; grew {growth:.2} MiB over {} tree deletes", 3 * TREES);
    assert!(growth < 1.0, "the live heap grew {growth:.2} MiB over {} tree deletes", 3 * TREES);
}
