//! Flash attention kernels: the cost model's price.

use crate::cost::*;
use crate::dim::numel;
use crate::ir::NodeId;

/// Online-softmax attention at each feasible (BR, BC) block pair.
pub(crate) fn flash_cost(k: &Kernel) -> Result<KernelCost, String> {
    let g = k.g;
    let members = k.members;
    let target = k.target;
    let out_bytes = k.out_bytes;
    let cached = k.cached;
    let launch = k.launch;
    let cx = &k.cx;
    let ins = &k.ins;
    let one_block = |tiles: f64, flops: Option<f64>| k.one_block(tiles, flops);
    let mut cands: Vec<Cand> = Vec::new();
    let f = crate::group::flash_parts(g, members).ok_or("not an attention pattern")?;
    let s = &g.node(f.scores).shape;
    let r = s.len();
    let (sq, sk) = (cx.n(&s[r - 2]), cx.n(&s[r - 1]));
    let batch = cx.n(&numel(&s[..r - 2])).max(1.0);
    let d = cx.n(g.node(g.node(f.qk).inputs[0]).shape.last().unwrap());
    let dv = cx.n(g.node(f.pv).shape.last().unwrap());
    let mm_flops = 2.0 * batch * sq * sk * (d + dv);
    // Per score: the chain (scale, mask), then max, subtract, sum and the rescale.
    let vec_f = batch * sq * sk * (f.chain.len() as f64 + 4.0);
    let q_bytes = cx.bytes(g.node(f.qk).inputs[0]);
    let kv_bytes = cx.bytes(g.node(f.qk).inputs[1]) + cx.bytes(g.node(f.pv).inputs[1]);
    let mask_bytes: f64 = ins
        .iter()
        .filter(|i| {
            **i != g.node(f.qk).inputs[0]
                && **i != g.node(f.qk).inputs[1]
                && **i != g.node(f.pv).inputs[1]
        })
        .map(|i| cx.bytes(*i))
        .sum();
    if target.runtime_blocking.is_some() && sq <= (crate::abi::MR_MAX / 2) as f64 {
        return few_queries_cost(
            k,
            &f,
            [sq, sk, batch, d, dv],
            [mm_flops, vec_f],
            q_bytes + mask_bytes,
        );
    }
    let db = if target.double_buffer { 2.0 } else { 1.0 };
    let (brs, bcs): (Vec<f64>, Vec<f64>) = match target.runtime_blocking {
        Some([_, _, _, br, bc]) => (
            [4.0, 8.0, 16.0, 32.0, 64.0].into_iter().filter(|x| *x <= br as f64).collect(),
            vec![bc as f64],
        ),
        None => (vec![16.0, 32.0, 64.0, 128.0], vec![32.0, 64.0, 128.0, 256.0]),
    };
    for &br in &brs {
        for &bc in &bcs {
            let (br, bc) = (f64::min(br, sq.max(1.0)), f64::min(bc, sk.max(1.0)));
            let qt = (sq / br).ceil().max(1.0);
            // K and V of one (batch, head) are read once per unit: on the host a unit
            // is as many query blocks of a head as leave two units per core (the
            // runtime's choice), on Ascend one query block.
            let kv_reads = if target.runtime_blocking.is_some() {
                (2.0 * target.cores.max(1) as f64 / batch).ceil().clamp(1.0, qt)
            } else {
                qt
            };
            // On Ascend, few query blocks split their keys over the idle AIVs (as
            // DynamicTiling does); each range's rows go through the workspace to the merge.
            let splits = if target.runtime_blocking.is_none() {
                crate::abi::ascend_flash_splits(
                    (batch * qt) as i64,
                    sk as i64,
                    bc as i64,
                    target.cores as i64,
                ) as f64
            } else {
                1.0
            };
            let partials =
                if splits > 1.0 { 2.0 * batch * sq * splits * (dv + 16.0) * 4.0 } else { 0.0 };
            let (kv_hbm, kv_llc) = cx.reread(kv_bytes / batch, kv_reads);
            let bytes =
                (q_bytes + kv_hbm * batch + mask_bytes + out_bytes + partials, kv_llc * batch);
            let onchip = (br * d + (bc * d + bc * dv) * db + br * bc + br * dv) * 4.0;
            let use_ = vec![(target.vector_memory().to_string(), cx.align(onchip))];
            let eff = (br / (br + 8.0)) * (bc / (bc + 16.0));
            // One exp per score, plus the rescale per row and key block.
            let t_exp = batch * sq * sk + batch * sq * (sk / bc).ceil();
            // K and V once per unit, Q once, P per key block. On the host, Q (f32
            // with contiguous rows) and P are read in place, and V, K with contiguous
            // rows are copies at the in-cache bandwidth; a transposed K is gathered.
            let pack = if target.runtime_blocking.is_some() {
                let contiguous = |v: NodeId| {
                    crate::layout::resolve(g, v).strides.last().and_then(|s| s.as_const())
                        == Some(1)
                };
                let (q, kt, v) =
                    (g.node(f.qk).inputs[0], g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
                let copy = |v: NodeId, elems: f64| {
                    elems * (g.node(v).dtype.size() + 4) as f64 / cx.llc_bw()
                };
                let q_us = if g.node(q).dtype.is_compute() && contiguous(q) {
                    0.0
                } else {
                    cx.pack_us(batch * sq * d)
                };
                let k_us = if contiguous(kt) {
                    copy(kt, batch * kv_reads * sk * d)
                } else {
                    cx.pack_us(batch * kv_reads * sk * d)
                };
                let v_us = if contiguous(v) {
                    copy(v, batch * kv_reads * sk * dv)
                } else {
                    cx.pack_us(batch * kv_reads * sk * dv)
                };
                q_us + k_us + v_us
            } else {
                cx.pack_us(batch * (sq * d + kv_reads * sk * (d + dv) + sq * sk))
            };
            let (exec, mem, comp, wave) = cx.exec_us(
                bytes,
                cached,
                mm_flops,
                vec_f,
                t_exp,
                pack,
                eff,
                one_block(batch * qt * splits, Some(4.0 * batch * sq * sk * d)),
                target.matrix_cores,
            );
            let ok = cx.fits(&use_);
            cands.push((
                exec,
                mem,
                comp,
                wave,
                bytes,
                Tiling::Flash { br: br as i64, bc: bc as i64 },
                use_,
                ok,
            ));
        }
    }
    best(cands, launch, mm_flops + vec_f)
}

/// The host kernel's few-queries path (a decode step, `host::few_queries`): a unit per KV
/// group and range of its keys computes all the group's query heads, so K and V are read
/// from memory once; per key block
/// their rows are copied (at the in-cache bandwidth) and each score is a dot product whose
/// sixteen lanes are summed at the end (`af_vdot`), about sixteen lanes' worth of work per
/// score beside its `d` multiply-adds.
fn few_queries_cost(
    k: &Kernel,
    f: &crate::group::FlashParts,
    [sq, sk, batch, d, dv]: [f64; 5],
    [mm_flops, vec_f]: [f64; 2],
    other_bytes: f64,
) -> Result<KernelCost, String> {
    let (g, cx) = (k.g, &k.cx);
    let s = &g.node(f.scores).shape;
    let (kt, v) = (g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
    let group = cx.n(&super::kv_group(g, kt, v, &s[..s.len() - 2])).clamp(1.0, batch);
    // The runtime splits each group's keys into ranges until there are two units per core
    // (`tiling::flash::few_queries`); merging the ranges' rows is small beside the keys.
    let groups = (batch / group).ceil();
    let bc = f64::min(crate::abi::BC_MAX as f64, sk.max(1.0));
    let splits =
        (2.0 * k.target.cores.max(1) as f64 / groups).ceil().clamp(1.0, (sk / bc).ceil().max(1.0));
    let units = groups * splits;
    let kv_bytes = cx.bytes(kt) + cx.bytes(v);
    let bytes = (other_bytes + kv_bytes + k.out_bytes, 0.0);
    let pack = groups * sk * (d + dv) * 8.0 / cx.llc_bw();
    let eff = d / (d + 16.0);
    let t_exp = batch * sq * sk + batch * sq * (sk / bc).ceil();
    let (exec, mem, comp, wave) = cx.exec_us(
        bytes,
        k.cached,
        mm_flops,
        vec_f,
        t_exp,
        pack,
        eff,
        k.one_block(units, Some(4.0 * batch * sq * sk * d)),
        k.target.matrix_cores,
    );
    let onchip = (bc * (d + dv) + group * sq * (d + bc + dv + 2.0)) * 4.0;
    let use_ = vec![(k.target.vector_memory().to_string(), cx.align(onchip))];
    let ok = cx.fits(&use_);
    let tiling = Tiling::Flash { br: sq as i64, bc: bc as i64 };
    best(vec![(exec, mem, comp, wave, bytes, tiling, use_, ok)], k.launch, mm_flops + vec_f)
}
