//! The worker's data path as a caller that has not proved itself sees it: the
//! challenge-response opener, then frames; and a caller reading frames a worker sent.
//! Any bytes are refused or read, never a panic, a hang or an unbounded allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use locus_common::security::{Secret, Verifier};
use locus_proto::pb;
use tokio::io::AsyncWriteExt;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (mut ours, mut theirs) = tokio::io::duplex(1 << 20);
        theirs.write_all(rest).await.unwrap();
        theirs.shutdown().await.unwrap();
        match mode % 3 {
            0 => {
                let v = Verifier::new(&Secret::generate());
                if locus_proto::accept_auth(&mut ours, &v, "fuzz").await.is_ok() {
                    panic!("a proof made without the key was taken");
                }
            }
            1 => while let Ok(Some(_)) = locus_proto::read_frame::<_, pb::DataRequest>(&mut ours).await {},
            _ => {
                let _ = locus_proto::read_response(&mut ours).await;
            }
        }
        drop(theirs);
    });
});
