//! Typed arena ids. A function stores its values, instructions and regions in `PrimaryMap`s
//! keyed by these; ids are cheap to copy and never dangle while the function lives.

use cranelift_entity::entity_impl;

/// An SSA value: an instruction result or a region argument.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(u32);
entity_impl!(Value, "v");

/// An instruction: one op applied to operands, with results and possibly regions.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Inst(u32);
entity_impl!(Inst, "inst");

/// A region: arguments, a straight-line list of instructions, and the values it yields.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Region(u32);
entity_impl!(Region, "region");
