//! The autofusion compiler, shared by the `#[fused_graph]` macro, `autofusion-build` and the
//! runtime: DSL front end (`front`), IR (`ir`, `dim`), canonicalisation (`canon`), the fusion
//! planner (`plan`, `target`), code generators (`codegen`) and reports (`report`).
//!
//! ```
//! let attr: proc_macro2::TokenStream = "dims(D = 8), opt_level = 2".parse().unwrap();
//! let item: syn::ItemFn = syn::parse_str(
//!     "fn ffn(x: Tensor<f32, {[S, D]}>, w: Tensor<f32, {[D, D]}>, b: Tensor<f32, {[D]}>) -> Tensor<f32, {[S, D]}> {
//!          silu(linear(x, w, b))
//!      }",
//! ).unwrap();
//! let unit = autofusion_compiler::Unit::parse(attr, &item).unwrap();
//! let fused = unit.variant(autofusion_compiler::Variant::Fused, &autofusion_compiler::target::Target::host());
//! assert_eq!(fused.plan.groups.len(), 1); // matmul + bias + silu in one kernel
//! ```

pub mod abi;
pub mod canon;
pub mod codegen;
pub mod cost;
pub mod diag;
pub mod dim;
pub mod front;
pub mod ir;
pub mod layout;
pub mod plan;
pub mod report;
pub mod target;
#[doc(hidden)]
pub mod testing;

use serde::{Deserialize, Serialize};

/// Which build of a graph: the planned one, or one kernel per op (the unfused baseline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Fused,
    Unfused,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Fused => "fused",
            Variant::Unfused => "unfused",
        }
    }
}

/// What the generated library embeds for the runtime (as JSON in the module descriptor).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleMeta {
    pub abi: u32,
    pub hash: String,
    pub variant: String,
    pub graph: ir::Graph,
    pub kernels: Vec<abi::KernelMeta>,
    /// The plan summary lines (DESIGN.md section 5), without the generated-files line.
    pub summary: Vec<String>,
    /// Run all kernels in one parallel region (the `pipeline` rule).
    #[serde(default)]
    pub pipeline: bool,
}

/// One `#[fused_graph]` function, parsed, checked and canonicalised.
#[derive(Clone, Debug)]
pub struct Unit {
    pub lowered: front::Lowered,
    /// The canonical graph (what plans and the reference interpreter run).
    pub graph: ir::Graph,
    /// Content hash of the graph and options: keys the build output.
    pub hash: String,
}

/// A planned and generated variant.
pub struct Built {
    pub variant: Variant,
    pub plan: plan::Plan,
    pub c: codegen::c::CSource,
    pub meta_json: String,
}

fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

impl Unit {
    /// Parse options and function, lower, check, canonicalise. All errors of the front end
    /// come back at once.
    pub fn parse(attr: proc_macro2::TokenStream, item: &syn::ItemFn) -> Result<Unit, diag::Diags> {
        match front::parse_options(attr) {
            Ok(o) => Unit::with_options(o, item),
            Err(mut d) => {
                // Still report body errors, checked with default options.
                if let Err(more) = front::lower(front::Options::default(), item) {
                    d.0.extend(more.0);
                }
                Err(d)
            }
        }
    }

    /// Like `parse`, with options given directly (tools re-planning a graph at other settings).
    pub fn with_options(opts: front::Options, item: &syn::ItemFn) -> Result<Unit, diag::Diags> {
        let lowered = front::lower(opts, item)?;
        ir::verify(&lowered.graph)
            .map_err(|e| diag::Diag::new(item.sig.ident.span(), format!("internal error: {e}")))?;
        let graph = canon::canonicalize(&lowered.graph);
        ir::verify(&graph).map_err(|e| {
            diag::Diag::new(
                item.sig.ident.span(),
                format!("internal error after canonicalize: {e}"),
            )
        })?;
        let o = &lowered.options;
        let key = format!(
            "{}|{}|opt{}|rules{}|debug{}|hints{:?}",
            env!("CARGO_PKG_VERSION"),
            graph.dump(),
            o.opt_level,
            o.rules.0,
            o.debug,
            o.hints
        );
        let hash = format!("{:016x}", fnv1a(&key));
        Ok(Unit { lowered, graph, hash })
    }

    pub fn name(&self) -> &str {
        &self.graph.name
    }

    /// The exported symbol of a variant's module descriptor.
    pub fn symbol(&self, v: Variant) -> String {
        symbol(&self.graph.name, &self.hash, v)
    }

    /// Plan and generate one variant.
    pub fn variant(&self, v: Variant, target: &target::Target) -> Built {
        let o = &self.lowered.options;
        let level = match v {
            Variant::Fused => o.opt_level,
            Variant::Unfused => 0,
        };
        let plan = plan::plan(&self.graph, level, o.rules, &o.hints, target);
        self.generate(v, plan, &self.symbol(v))
    }

    /// Generate code for a given plan (tools and benchmarks build plans of their own).
    pub fn generate(&self, v: Variant, plan: plan::Plan, symbol: &str) -> Built {
        let header = format!(
            "graph `{}` ({} variant), plan {} at opt_level {}, target {}",
            self.graph.name,
            v.name(),
            self.hash,
            plan.opt_level,
            plan.target.name
        );
        let mut summary = report::summary(&self.graph, &plan, &[]);
        summary.pop();
        let meta = |kernels: &[abi::KernelMeta]| {
            serde_json::to_string(&ModuleMeta {
                abi: abi::ABI_VERSION,
                hash: self.hash.clone(),
                variant: v.name().into(),
                graph: self.graph.clone(),
                kernels: kernels.to_vec(),
                summary: summary.clone(),
                pipeline: plan.pipeline,
            })
            .expect("metadata serialises")
        };
        let c = codegen::c::generate(&self.graph, &plan, symbol, &header, &meta);
        let meta_json = meta(&c.kernels);
        Built { variant: v, plan, c, meta_json }
    }
}

impl Unit {
    /// Plan one variant for `target` (normally `ascend910b`) and generate its Ascend C.
    /// The opt-in `qkv_horizontal` rule is not applied on Ascend: the generator has no
    /// horizontal kernel (on the NPU the projections run as separate mix launches, or as bodies
    /// of the one pipeline launch at opt_level 3).
    pub fn variant_ascend(
        &self,
        v: Variant,
        target: &target::Target,
    ) -> Result<(plan::Plan, codegen::ascend::AscendSource), String> {
        let o = &self.lowered.options;
        let level = match v {
            Variant::Fused => o.opt_level,
            Variant::Unfused => 0,
        };
        let mut rules = o.rules;
        rules.remove(plan::Rule::QkvHorizontal);
        let plan = plan::plan(&self.graph, level, rules, &o.hints, target);
        let src = self.generate_ascend(v, &plan, &self.symbol(v))?;
        Ok((plan, src))
    }

    /// Generate Ascend C for a given plan.
    pub fn generate_ascend(
        &self,
        v: Variant,
        plan: &plan::Plan,
        symbol: &str,
    ) -> Result<codegen::ascend::AscendSource, String> {
        if self.graph.dyn_dims.len() > abi::ASCEND_MAX_DIMS {
            return Err(format!(
                "graph `{}` has {} dynamic dims; the Ascend kernels take at most {}",
                self.graph.name,
                self.graph.dyn_dims.len(),
                abi::ASCEND_MAX_DIMS
            ));
        }
        let header = format!(
            "graph `{}` ({} variant), plan {} at opt_level {}, target {}",
            self.graph.name,
            v.name(),
            self.hash,
            plan.opt_level,
            plan.target.name
        );
        codegen::ascend::generate(&self.graph, plan, symbol, &header)
    }
}

/// The `#[fused_graph(...)]` functions of a file (also inside inline modules), each with the
/// tokens of its attribute's arguments.
pub fn find_graphs(items: &[syn::Item]) -> Vec<(&syn::ItemFn, proc_macro2::TokenStream)> {
    let mut out = Vec::new();
    for item in items {
        match item {
            syn::Item::Fn(f) => {
                for a in &f.attrs {
                    if a.path().segments.last().is_some_and(|s| s.ident == "fused_graph") {
                        let tokens = match &a.meta {
                            syn::Meta::List(l) => l.tokens.clone(),
                            _ => proc_macro2::TokenStream::new(),
                        };
                        out.push((f, tokens));
                    }
                }
            }
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    out.extend(find_graphs(items));
                }
            }
            _ => {}
        }
    }
    out
}

/// `af_<graph>_<hash>_<variant>`.
pub fn symbol(name: &str, hash: &str, v: Variant) -> String {
    format!("af_{name}_{hash}_{}", v.name())
}

/// The rustc env var through which build.rs tells the macro expansion which hash it built.
pub fn env_var(name: &str) -> String {
    format!("AUTOFUSION_GRAPH_{}", name.to_ascii_uppercase())
}
