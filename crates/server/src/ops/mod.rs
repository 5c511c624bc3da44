//! The operations a server performs on its shard, one file per family (as
//! 3FS keeps one file per metadata operation). Each adds methods to
//! `Server`; `dispatch.rs` is the one table from opcode to them.

mod create;
mod data;
mod fsck;
mod link;
mod lookup;
mod remove;
mod setattr;
