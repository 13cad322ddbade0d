//! The S3 gateway as a client without keys meets it: any bytes on a connection (HTTP/1
//! request lines and headers, chunked bodies, SigV4 `Authorization` headers and
//! presigned queries, S3 XML bodies) get an answer or a closed connection, never a
//! panic or a hang. The gateway is the real one, in this process, with a master that is
//! not there (what would reach it fails as unavailable).
#![no_main]
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;

#[path = "common/gateway.rs"]
mod common;
use common::gateway;

fuzz_target!(|data: &[u8]| {
    let mut s = TcpStream::connect(gateway()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    // The gateway may answer and close before it has read everything.
    let _ = s.write_all(data);
    let _ = s.shutdown(Shutdown::Write);
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        assert!(
            e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
            "the gateway hung"
        );
    }
});
