//! etcd's v3 gRPC API: the messages and the clients of the four services the backend calls
//! (KV, Watch, Lease, Auth), as Rust code generated from the `.proto` files in `api/` and
//! committed, so that a build needs no protobuf compiler. `cargo run -p xtask -- codegen`
//! regenerates it; the xtask crate's test fails when the committed code differs from what the
//! `.proto` files generate. The two messages that carry a password or a token have a `Debug`
//! written here that hides them.

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

    // The messages that carry a password or a token show neither.

    impl std::fmt::Debug for AuthenticateRequest {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "AuthenticateRequest {{ name: {:?}, password: *** }}",
                self.name
            )
        }
    }

    impl std::fmt::Debug for AuthenticateResponse {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "AuthenticateResponse {{ header: {:?}, token: *** }}",
                self.header
            )
        }
    }
}
