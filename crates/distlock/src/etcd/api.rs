//! etcd's v3 gRPC API: the messages and the clients of the three services the backend calls
//! (KV, Watch, Lease), as Rust code generated from the `.proto` files in `api/` and
//! committed, so that a build needs no protobuf compiler. `cargo run -p xtask -- codegen`
//! regenerates it; the xtask crate's test fails when the committed code differs from what the
//! `.proto` files generate.

#![allow(
    missing_docs,
    dead_code,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rustdoc::all
)]

pub(crate) mod mvccpb {
    include!("api/mvccpb.rs");
}

pub(crate) mod etcdserverpb {
    include!("api/etcdserverpb.rs");
}
