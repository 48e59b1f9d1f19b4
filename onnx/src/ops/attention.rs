//! `Attention` (opset 23 on): scaled dot-product attention over 4-D `[B, H, S, D]` or 3-D
//! `[B, S, H·D]` inputs, with multi-, grouped- and multi-query heads, a boolean or additive
//! mask, offset-aware causal masking, sliding windows, soft-capping, a key/value cache (past and present), and
//! fully masked rows giving zeros rather than NaN.

use crate::context::{Converted, Ctx, Fail, unsupported};
use kiln_ir::{BinaryOp, CompareOp, DType, Dim, ReduceOp, Shape, Value};
use kiln_runtime::composite;

/// `[B, S, H·D]` → `[B, H, S, D]` for `heads` heads (4-D inputs pass through).
fn split_heads(c: &mut Ctx, x: Value, heads: Option<usize>) -> Result<Value, Fail> {
    let d = c.ty(x).shape.dims().to_vec();
    match (d.len(), heads) {
        (4, _) => Ok(x),
        (3, Some(h)) => {
            let width = d[2].as_fixed().ok_or("the hidden size must be static")?;
            if h == 0 || width % h != 0 {
                return Err(Fail::Invalid(format!(
                    "{width} features do not split into {h} heads"
                )));
            }
            let shape = Shape(vec![
                d[0].clone(),
                d[1].clone(),
                Dim::Fixed(h),
                Dim::Fixed(width / h),
            ]);
            let y = c.b.reshape(x, shape)?;
            Ok(c.b.transpose(y, vec![0, 2, 1, 3])?)
        }
        (3, None) => Err("3-D inputs need q_num_heads and kv_num_heads".into()),
        (r, _) => Err(Fail::Invalid(format!("inputs of rank {r} (3 or 4)"))),
    }
}

/// Key or value heads repeated for grouped-query attention: head `h` of the query uses head
/// `h / group`.
fn repeat_heads(c: &mut Ctx, x: Value, group: usize) -> Result<Value, Fail> {
    if group == 1 {
        return Ok(x);
    }
    let d = c.ty(x).shape.dims().to_vec();
    let heads = d[1].as_fixed().ok_or("the head count must be static")?;
    let mut wide = d.clone();
    wide.insert(2, Dim::Fixed(1));
    let y = c.b.reshape(x, Shape(wide.clone()))?;
    wide[2] = Dim::Fixed(group);
    let y = c.b.broadcast_to(y, &Shape(wide))?;
    let out = Shape(vec![
        d[0].clone(),
        Dim::Fixed(heads * group),
        d[2].clone(),
        d[3].clone(),
    ]);
    Ok(c.b.reshape(y, out)?)
}

/// `0` where allowed and `−∞` elsewhere, from a boolean `allowed`.
fn bias_of(c: &mut Ctx, allowed: Value, dtype: DType) -> Result<Value, Fail> {
    let (zero, minus) = (c.scalar(dtype, 0.0)?, c.scalar(dtype, f64::NEG_INFINITY)?);
    Ok(c.b.select(allowed, zero, minus)?)
}

/// Scores `[B, H, Sq, Sk]` with the mask, the causal frontier and soft-capping applied, and the
/// raw products (`qk_matmul_output` mode 0).
fn scores(c: &mut Ctx, q: Value, k: Value, past: usize) -> Result<[Value; 3], Fail> {
    let t = c.ty(q);
    let dtype = t.dtype;
    let head = t.shape.dims()[3]
        .as_fixed()
        .ok_or("the head size must be static")?;
    let scale = match c.node.attr("scale").and_then(|a| a.f) {
        Some(s) => s as f64,
        None => 1.0 / (head as f64).sqrt(),
    };
    // Both operands scaled by √scale, as ONNX does against overflow; a negative scale (whose
    // root is not real) scales the queries alone.
    let (qs, ks) = match scale >= 0.0 {
        true => {
            let root = c.scalar(dtype, scale.sqrt())?;
            (c.b.mul(q, root)?, c.b.mul(k, root)?)
        }
        false => {
            let s = c.scalar(dtype, scale)?;
            (c.b.mul(q, s)?, k)
        }
    };
    let raw = c.b.matmul_t(qs, ks, false, true)?;
    let softcap = c.node.float("softcap", 0.0)? as f64;
    let capped = match softcap > 0.0 {
        true => {
            let (cap, inv) = (c.scalar(dtype, softcap)?, c.scalar(dtype, 1.0 / softcap)?);
            let z = c.b.mul(raw, inv)?;
            let z = c.b.tanh(z)?;
            c.b.mul(z, cap)?
        }
        false => raw,
    };
    let mut s = capped;
    if let Some(mask) = c.optional(3)? {
        let bias = match c.dtype(mask) {
            DType::Bool => bias_of(c, mask, dtype)?,
            _ => mask,
        };
        s = c.b.add(s, bias)?;
    }
    if let Some(allowed) = frontier(c, s, past)? {
        let bias = bias_of(c, allowed, dtype)?;
        s = c.b.add(s, bias)?;
    }
    Ok([raw, capped, s])
}

/// The keys each query may see under `is_causal` and the windows: query `i` is at absolute
/// position `p = i + past`, and sees key `j` when `j ≤ p` (causal) and
/// `p − left ≤ j ≤ p + right` (each window bound that is not −1). `None` when nothing limits.
fn frontier(c: &mut Ctx, s: Value, past: usize) -> Result<Option<Value>, Fail> {
    let causal = c.node.int("is_causal", 0)? != 0;
    let (left, right) = (
        c.node.int("left_window_size", -1)?,
        c.node.int("right_window_size", -1)?,
    );
    let mut limits: Vec<(CompareOp, i64)> = Vec::new();
    if causal {
        limits.push((CompareOp::Le, 0));
    }
    if right >= 0 {
        limits.push((CompareOp::Le, right));
    }
    if left >= 0 {
        limits.push((CompareOp::Ge, -left));
    }
    if limits.is_empty() {
        return Ok(None);
    }
    let st = c.ty(s).with_dtype(DType::I64);
    let rank = st.rank();
    let (rows, cols) = (c.b.iota(st.clone(), rank - 2)?, c.b.iota(st, rank - 1)?);
    let offset = c.scalar(DType::I64, past as f64)?;
    let position = c.b.add(rows, offset)?;
    let distance = c.b.sub(cols, position)?;
    let mut checks = Vec::with_capacity(limits.len());
    for (op, bound) in limits {
        let bound = c.scalar(DType::I64, bound as f64)?;
        checks.push(c.b.compare(op, distance, bound)?);
    }
    c.combine(BinaryOp::And, checks)
}

/// Softmax over the keys, with fully masked rows (every score −∞) giving zeros.
fn guarded_softmax(c: &mut Ctx, s: Value) -> Result<Value, Fail> {
    let t = c.ty(s);
    let last = t.rank() - 1;
    let work = match c.node.int_opt("softmax_precision")? {
        None => t.dtype,
        Some(1) => DType::F32,
        Some(11) => DType::F64,
        Some(p) => return unsupported(format!("softmax_precision {p}")),
    };
    let s = c.b.cast(s, work)?;
    let m = c.b.reduce(ReduceOp::Max, s, vec![last], true)?;
    let minus = c.scalar(work, f64::NEG_INFINITY)?;
    let dead = c.b.eq(m, minus)?;
    let dead = c.b.broadcast_to(dead, &t.shape)?;
    let zero = c.scalar(work, 0.0)?;
    let safe = c.b.select(dead, zero, s)?;
    let p = composite::softmax(c.b, safe, last)?;
    let p = c.b.select(dead, zero, p)?;
    Ok(c.b.cast(p, t.dtype)?)
}

/// The heads of a `[B, H, S, D]` value.
fn heads(c: &Ctx, x: Value) -> Result<usize, Fail> {
    Ok(c.ty(x).shape.dims()[1]
        .as_fixed()
        .ok_or("head counts must be static")?)
}

/// On 4-D inputs the heads are the shapes' second axis: a `q_num_heads` or `kv_num_heads`
/// given that says otherwise contradicts it (ONNX means them for 3-D inputs).
fn check_head_attributes(
    c: &Ctx,
    [q, k, v]: [Value; 3],
    [q_heads, kv_heads]: [Option<usize>; 2],
) -> Result<(), Fail> {
    let checks = [
        ("Q", q, "q_num_heads", q_heads),
        ("K", k, "kv_num_heads", kv_heads),
        ("V", v, "kv_num_heads", kv_heads),
    ];
    for (what, x, attr, want) in checks {
        let shape = c.ty(x).shape;
        let (Some(want), 4) = (want, shape.rank()) else {
            continue;
        };
        if shape.dims()[1].as_fixed().is_some_and(|h| h != want) {
            return Err(Fail::Invalid(format!(
                "{what} {shape} has {} heads, but {attr}={want}",
                shape.dims()[1]
            )));
        }
    }
    Ok(())
}

/// The query and key/value heads of the split `[B, H, S, D]` inputs: K and V share
/// kv_num_heads, which must divide the query heads (each key head serves a group of them) —
/// else keys and values would be repeated over the wrong heads.
fn head_counts(c: &Ctx, given: [Value; 3], [q, k, v]: [Value; 3]) -> Result<(usize, usize), Fail> {
    let [gq, gk, gv] = given.map(|x| c.ty(x).shape);
    let (hq, hk, hv) = (heads(c, q)?, heads(c, k)?, heads(c, v)?);
    if hk != hv {
        return Err(Fail::Invalid(format!(
            "K {gk} has {hk} heads but V {gv} has {hv}: they should share kv_num_heads"
        )));
    }
    if hk == 0 || hq % hk != 0 {
        return Err(Fail::Invalid(format!(
            "the {hq} query heads of Q {gq} do not group over the {hk} key heads of K {gk}"
        )));
    }
    Ok((hq, hk))
}

/// K and V after their caches, and the cache length. ONNX takes past_key and past_value
/// together: one alone would leave keys and values of different lengths.
fn with_past(c: &mut Ctx, k: Value, v: Value) -> Result<(Value, Value, usize), Fail> {
    let (pk, pv) = match (c.optional(4)?, c.optional(5)?) {
        (None, None) => return Ok((k, v, 0)),
        (Some(pk), Some(pv)) => (pk, pv),
        (Some(x), None) | (None, Some(x)) => {
            let (what, missing) = match c.has(4) {
                true => ("past_key", "past_value"),
                false => ("past_value", "past_key"),
            };
            return Err(Fail::Invalid(format!(
                "{what} {} is given without {missing}: the two caches go together",
                c.ty(x).shape
            )));
        }
    };
    let dims = c.ty(pk).shape.dims().to_vec();
    if dims.len() != 4 {
        return Err("past_key should be [B, H, P, D]".into());
    }
    let past = dims[2]
        .as_fixed()
        .ok_or("the cache length must be static")?;
    Ok((c.b.concat(&[pk, k], 2)?, c.b.concat(&[pv, v], 2)?, past))
}

/// `Attention(Q, K, V, attn_mask, past_key, past_value)`.
pub(super) fn attention(c: &mut Ctx) -> Converted {
    if c.has(6) {
        return unsupported("nonpad_kv_seqlen");
    }
    let q_heads = c.node.int_opt("q_num_heads")?.map(|h| h.max(0) as usize);
    let kv_heads = c.node.int_opt("kv_num_heads")?.map(|h| h.max(0) as usize);
    let given = [c.input(0)?, c.input(1)?, c.input(2)?];
    check_head_attributes(c, given, [q_heads, kv_heads])?;
    let [q, k, v] = given;
    let three_d = c.rank(q) == 3;
    let q = split_heads(c, q, q_heads)?;
    let k = split_heads(c, k, kv_heads)?;
    let v = split_heads(c, v, kv_heads)?;
    let (hq, hkv) = head_counts(c, given, [q, k, v])?;
    let (k, v, past) = with_past(c, k, v)?;
    let (kr, vr) = (repeat_heads(c, k, hq / hkv)?, repeat_heads(c, v, hq / hkv)?);
    let [raw, capped, biased] = scores(c, q, kr, past)?;
    let p = guarded_softmax(c, biased)?;
    let mut y = c.b.matmul(p, vr)?;
    if three_d {
        let d = c.ty(y).shape.dims().to_vec();
        let width = d[1]
            .as_fixed()
            .zip(d[3].as_fixed())
            .map(|(h, e)| h * e)
            .ok_or("static heads")?;
        y = c.b.transpose(y, vec![0, 2, 1, 3])?;
        y = c.b.reshape(
            y,
            Shape(vec![d[0].clone(), d[2].clone(), Dim::Fixed(width)]),
        )?;
    }
    let qk = match c.node.int("qk_matmul_output_mode", 0)? {
        0 => raw,
        1 => capped,
        2 => biased,
        3 => p,
        m => return Err(Fail::Invalid(format!("qk_matmul_output_mode {m}"))),
    };
    Ok(vec![y, k, v, qk])
}
