//! Functions: typed arguments, an SSA body of instructions in nested regions, typed results.
//!
//! Architecture invariants:
//! - Definitions live in arenas (`values`, `insts`, `regions`); *where* an instruction sits is
//!   the `insts` list of its region. Passes that reorder touch only those lists.
//! - A region is straight-line code: arguments, instructions, yielded values. Control flow is
//!   structured (`cond`, `while` own regions), so SSA dominance is lexical: a value may be used
//!   after its definition in its own region and in regions nested below that point.
//! - The function's arguments are its body region's arguments; its results are the values that
//!   region yields.
//! - Value names are optional, unique within a function, and part of the IR (they survive a
//!   print/parse round trip); unnamed values print as `%0`, `%1`, … in order of definition.

use crate::entities::{Inst, Region, Value};
use crate::loc::Loc;
use crate::op::Op;
use crate::types::Type;
use cranelift_entity::PrimaryMap;
use std::collections::{HashMap, HashSet};

/// Where a value is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// Result `index` of an instruction.
    Result(Inst, usize),
    /// Argument `index` of a region.
    Arg(Region, usize),
}

/// A value: its type, where it is defined, and its name in the text form, if any.
#[derive(Clone, Debug)]
pub struct ValueData {
    /// The value's type.
    pub ty: Type,
    /// Where the value is defined.
    pub def: ValueDef,
    /// Its name in the text form (`%logits`); unnamed values print as numbers.
    pub name: Option<String>,
}

/// An instruction: an op applied to arguments, with its results and regions.
#[derive(Clone, Debug)]
pub struct InstData {
    /// What the instruction computes.
    pub op: Op,
    /// The operands.
    pub args: Vec<Value>,
    /// The values it defines.
    pub results: Vec<Value>,
    /// Its regions (`cond`'s branches, `while`'s condition and body, a `fused` body).
    pub regions: Vec<Region>,
    /// Where it was built or parsed.
    pub loc: Loc,
}

/// A region: arguments, instructions in order, and the values it yields.
#[derive(Clone, Debug, Default)]
pub struct RegionData {
    /// The region's arguments (loop-carried values, a fused kernel's operands).
    pub args: Vec<Value>,
    /// The instructions, in order.
    pub insts: Vec<Inst>,
    /// The values the region yields.
    pub results: Vec<Value>,
    /// The instruction that owns this region; `None` for a function body.
    pub parent: Option<Inst>,
}

/// How deeply regions may nest in a function (a `cond`'s branches, a `while`'s condition and
/// body, a `fused` group), below its body: the one limit every source of programs holds them
/// to — the parser, the builder (static programs, eager tracing, ONNX `If` and `Loop`) — so
/// that the passes, which walk regions by recursion, stay within any thread's stack.
pub const MAX_REGION_DEPTH: usize = 64;

/// A function: arenas of values, instructions and regions, with the layout (which
/// instructions each region holds, in order) kept apart from the definitions.
#[derive(Clone, Debug)]
pub struct Function {
    name: String,
    values: PrimaryMap<Value, ValueData>,
    insts: PrimaryMap<Inst, InstData>,
    regions: PrimaryMap<Region, RegionData>,
    body: Region,
    result_types: Vec<Type>,
    /// Where the function was defined (its `func` keyword in text); not part of equality.
    loc: Loc,
}

impl Function {
    /// An empty function named `name`.
    pub fn new(name: impl Into<String>) -> Function {
        let mut regions = PrimaryMap::new();
        let body = regions.push(RegionData::default());
        Function {
            name: name.into(),
            values: PrimaryMap::new(),
            insts: PrimaryMap::new(),
            regions,
            body,
            result_types: Vec::new(),
            loc: Loc::Unknown,
        }
    }

    /// Where the function was built or parsed.
    pub fn loc(&self) -> Loc {
        self.loc
    }

    /// Sets where the function was built or parsed.
    pub fn set_loc(&mut self, loc: Loc) {
        self.loc = loc;
    }

    /// The function's name (`@name` in the text form).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renames the function.
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    /// The top-level region.
    pub fn body(&self) -> Region {
        self.body
    }

    /// The function's arguments, in order.
    pub fn args(&self) -> &[Value] {
        &self.regions[self.body].args
    }

    /// The values the function returns, in order.
    pub fn results(&self) -> &[Value] {
        &self.regions[self.body].results
    }

    /// The declared result types (the signature); the verifier checks the body yields them.
    pub fn result_types(&self) -> &[Type] {
        &self.result_types
    }

    /// Declares the types the function returns.
    pub fn set_result_types(&mut self, types: Vec<Type>) {
        self.result_types = types;
    }

    /// The types of the arguments, in order.
    pub fn arg_types(&self) -> impl Iterator<Item = &Type> {
        self.args().iter().map(|&v| &self.values[v].ty)
    }

    /// The definition of `v`.
    pub fn value(&self, v: Value) -> &ValueData {
        &self.values[v]
    }

    /// The type of `v`.
    pub fn value_type(&self, v: Value) -> &Type {
        &self.values[v].ty
    }

    /// The name of `v` in the text form, if it has one.
    pub fn value_name(&self, v: Value) -> Option<&str> {
        self.values[v].name.as_deref()
    }

    /// Names (or unnames) `v`.
    pub fn set_value_name(&mut self, v: Value, name: Option<String>) {
        self.values[v].name = name;
    }

    /// Sets a value's type. Passes use this when they change what defines a value; the
    /// verifier checks the result.
    pub fn set_value_type(&mut self, v: Value, ty: Type) {
        self.values[v].ty = ty;
    }

    /// The instruction `i`.
    pub fn inst(&self, i: Inst) -> &InstData {
        &self.insts[i]
    }

    /// The instruction `i`, to change.
    pub fn inst_mut(&mut self, i: Inst) -> &mut InstData {
        &mut self.insts[i]
    }

    /// The region `r`.
    pub fn region(&self, r: Region) -> &RegionData {
        &self.regions[r]
    }

    /// The region `r`, to change.
    pub fn region_mut(&mut self, r: Region) -> &mut RegionData {
        &mut self.regions[r]
    }

    /// Every value ever created, including those of instructions a pass has removed.
    pub fn all_values(&self) -> impl Iterator<Item = (Value, &ValueData)> {
        self.values.iter()
    }

    /// How many values the function has defined (an upper bound on value indices).
    pub fn num_values(&self) -> usize {
        self.values.len()
    }

    /// Whether `v` is a value of this function (an id of another function may not be).
    pub fn has_value(&self, v: Value) -> bool {
        self.values.is_valid(v)
    }

    /// The instruction whose result `v` is (`None` for a region argument).
    pub fn producer(&self, v: Value) -> Option<Inst> {
        match self.values[v].def {
            ValueDef::Result(inst, _) => Some(inst),
            ValueDef::Arg(..) => None,
        }
    }

    /// A new, empty region not yet owned by an instruction.
    pub fn create_region(&mut self) -> Region {
        self.regions.push(RegionData::default())
    }

    /// Adds an argument of `ty` to `region` and returns it.
    pub fn append_region_arg(&mut self, region: Region, ty: Type, name: Option<String>) -> Value {
        let index = self.regions[region].args.len();
        let v = self.values.push(ValueData {
            ty,
            def: ValueDef::Arg(region, index),
            name,
        });
        self.regions[region].args.push(v);
        v
    }

    /// Creates an instruction with fresh result values of `result_types`, owning `regions`.
    /// It is not placed in any region yet: see [`Function::append_inst`].
    pub fn create_inst(
        &mut self,
        op: Op,
        args: Vec<Value>,
        result_types: Vec<Type>,
        regions: Vec<Region>,
        loc: Loc,
    ) -> Inst {
        let inst = self.insts.push(InstData {
            op,
            args,
            results: Vec::with_capacity(result_types.len()),
            regions: regions.clone(),
            loc,
        });
        for (index, ty) in result_types.into_iter().enumerate() {
            let v = self.values.push(ValueData {
                ty,
                def: ValueDef::Result(inst, index),
                name: None,
            });
            self.insts[inst].results.push(v);
        }
        for r in regions {
            self.regions[r].parent = Some(inst);
        }
        inst
    }

    /// Removes the arguments of `region` for which `keep` is false, renumbering the rest.
    /// The removed values must have no uses left.
    pub fn retain_region_args(&mut self, region: Region, keep: impl Fn(Value) -> bool) {
        let args: Vec<Value> = self.regions[region]
            .args
            .iter()
            .copied()
            .filter(|&v| keep(v))
            .collect();
        for (index, &v) in args.iter().enumerate() {
            self.values[v].def = ValueDef::Arg(region, index);
        }
        self.regions[region].args = args;
    }

    /// Places `inst` at the end of `region`.
    pub fn append_inst(&mut self, region: Region, inst: Inst) {
        self.regions[region].insts.push(inst);
    }

    /// Sets the values `region` yields.
    pub fn set_region_results(&mut self, region: Region, values: Vec<Value>) {
        self.regions[region].results = values;
    }

    /// Every placed instruction, depth first in layout order (an instruction before the
    /// instructions of its regions).
    pub fn walk_insts(&self) -> Vec<Inst> {
        let mut out = Vec::new();
        self.walk_region(self.body, &mut out);
        out
    }

    fn walk_region(&self, region: Region, out: &mut Vec<Inst>) {
        for &inst in &self.regions[region].insts {
            out.push(inst);
            for &r in &self.insts[inst].regions {
                self.walk_region(r, out);
            }
        }
    }

    /// Replaces every use of each key of `map` (operands and yielded values) with its value,
    /// in one walk over the function. Chains (`a → b`, `b → c`) are followed.
    pub fn replace_uses_map(&mut self, map: &HashMap<Value, Value>) {
        if map.is_empty() {
            return;
        }
        let resolve = |mut v: Value| {
            let mut steps = 0;
            while let Some(&next) = map.get(&v) {
                v = next;
                steps += 1;
                if steps > map.len() {
                    break;
                }
            }
            v
        };
        for inst in self.walk_insts() {
            for arg in &mut self.insts[inst].args {
                *arg = resolve(*arg);
            }
        }
        for (_, region) in self.regions.iter_mut() {
            for res in &mut region.results {
                *res = resolve(*res);
            }
        }
    }

    /// Replaces every use of `old` (operands and yielded values) with `new`.
    pub fn replace_uses(&mut self, old: Value, new: Value) {
        for inst in self.walk_insts() {
            for arg in &mut self.insts[inst].args {
                if *arg == old {
                    *arg = new;
                }
            }
        }
        for (_, region) in self.regions.iter_mut() {
            for res in &mut region.results {
                if *res == old {
                    *res = new;
                }
            }
        }
    }

    /// For each instruction of `region`, the values defined in the region (its arguments and
    /// its instructions' results) that the instruction reads last — directly or from inside
    /// its own regions — or, when nothing reads them, defines; never the region's results.
    /// What a run may drop after each instruction.
    pub fn last_reads(&self, region: Region) -> Vec<Vec<Value>> {
        let data = self.region(region);
        let mut last: HashMap<Value, usize> = HashMap::new();
        for (i, &inst) in data.insts.iter().enumerate() {
            for &r in &self.inst(inst).results {
                last.insert(r, i);
            }
        }
        let mut local: HashSet<Value> = last.keys().copied().collect();
        local.extend(data.args.iter().copied());
        for (i, &inst) in data.insts.iter().enumerate() {
            let d = self.inst(inst);
            let inner = d.regions.iter().flat_map(|&r| self.free_values(r));
            for v in d.args.iter().copied().chain(inner) {
                if local.contains(&v) {
                    last.insert(v, i);
                }
            }
        }
        let results: HashSet<Value> = data.results.iter().copied().collect();
        let mut out = vec![Vec::new(); data.insts.len()];
        for (v, i) in last {
            if !results.contains(&v) {
                out[i].push(v);
            }
        }
        out
    }

    /// Values used in `region` (or regions nested in it) but defined outside it, in order of
    /// first use: what the region captures.
    pub fn free_values(&self, region: Region) -> Vec<Value> {
        let mut defined = HashSet::new();
        let mut out = Vec::new();
        self.collect_free(region, &mut defined, &mut out);
        out
    }

    fn collect_free(&self, region: Region, defined: &mut HashSet<Value>, out: &mut Vec<Value>) {
        let data = &self.regions[region];
        defined.extend(data.args.iter().copied());
        let note = |v: Value, defined: &HashSet<Value>, out: &mut Vec<Value>| {
            if !defined.contains(&v) && !out.contains(&v) {
                out.push(v);
            }
        };
        for &inst in &data.insts {
            let d = &self.insts[inst];
            for &a in &d.args {
                note(a, defined, out);
            }
            for &r in &d.regions {
                self.collect_free(r, defined, out);
            }
            defined.extend(d.results.iter().copied());
        }
        for &v in &data.results {
            note(v, defined, out);
        }
    }

    /// The number of placed instructions, counting those inside regions.
    pub fn num_insts(&self) -> usize {
        self.walk_insts().len()
    }
}

/// Two functions are equal when they have the same name and signature and their bodies match
/// instruction for instruction: same ops, same value names and types, operands that correspond.
/// Arena ids and source locations do not take part, so a parsed function equals the function
/// that was printed.
impl PartialEq for Function {
    fn eq(&self, other: &Function) -> bool {
        self.name == other.name
            && self.result_types == other.result_types
            && StructuralMatch::new(self, other).regions(self.body, other.body)
    }
}

struct StructuralMatch<'a> {
    a: &'a Function,
    b: &'a Function,
    map: HashMap<Value, Value>,
}

impl<'a> StructuralMatch<'a> {
    fn new(a: &'a Function, b: &'a Function) -> Self {
        StructuralMatch {
            a,
            b,
            map: HashMap::new(),
        }
    }

    fn define(&mut self, x: Value, y: Value) -> bool {
        let (dx, dy) = (self.a.value(x), self.b.value(y));
        self.map.insert(x, y);
        dx.ty == dy.ty && dx.name == dy.name
    }

    fn uses(&self, xs: &[Value], ys: &[Value]) -> bool {
        xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| self.map.get(x) == Some(y))
    }

    fn regions(&mut self, ra: Region, rb: Region) -> bool {
        let (a, b) = (self.a.region(ra), self.b.region(rb));
        if a.args.len() != b.args.len() || a.insts.len() != b.insts.len() {
            return false;
        }
        for (&x, &y) in a.args.iter().zip(&b.args) {
            if !self.define(x, y) {
                return false;
            }
        }
        for (&ia, &ib) in a.insts.iter().zip(&b.insts) {
            if !self.insts(ia, ib) {
                return false;
            }
        }
        self.uses(&a.results, &b.results)
    }

    fn insts(&mut self, ia: Inst, ib: Inst) -> bool {
        let (a, b) = (self.a.inst(ia), self.b.inst(ib));
        if a.op != b.op
            || !self.uses(&a.args, &b.args)
            || a.results.len() != b.results.len()
            || a.regions.len() != b.regions.len()
        {
            return false;
        }
        let regions_match = a
            .regions
            .iter()
            .zip(&b.regions)
            .all(|(&x, &y)| self.regions(x, y));
        regions_match
            && a.results
                .iter()
                .zip(&b.results)
                .all(|(&x, &y)| self.define(x, y))
    }
}
