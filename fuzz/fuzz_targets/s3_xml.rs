//! The S3 XML bodies the gateway takes (through `s3s`'s deserializer): any bytes give a
//! value or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use s3s::dto::*;
use s3s::xml::{Deserialize, Deserializer};

fn one<'a, T: Deserialize<'a>>(data: &'a [u8]) {
    let mut d = Deserializer::new(data);
    let _ = T::deserialize(&mut d);
}

fuzz_target!(|data: &[u8]| {
    one::<CompletedMultipartUpload>(data);
    one::<Delete>(data);
    one::<Tagging>(data);
    one::<CreateBucketConfiguration>(data);
    one::<SelectObjectContentRequest>(data);
    one::<VersioningConfiguration>(data);
    one::<AccessControlPolicy>(data);
    one::<BucketLifecycleConfiguration>(data);
    one::<RestoreRequest>(data);
});
