//! A graph and its options, whatever produced it (the DSL front end, the graph builder, an
//! importer): checked, canonicalised and hashed, then planned and generated per variant.

use crate::codegen::{host::Host, Backend};
use crate::dim::Shape;
use crate::ir::{self, DType, Graph};
use crate::plan::RuleSet;
use crate::{canon, codegen, plan, target, Variant};

/// Planning options of a graph: those of `#[fused_graph(...)]`, or given with
/// `Unit::from_graph`.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub dims: Vec<(String, i64)>,
    /// Planning estimates for dynamic dims (`hints(S = 512)`); default 128.
    pub hints: Vec<(String, i64)>,
    pub opt_level: u8,
    pub rules: RuleSet,
    pub debug: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            dims: Vec::new(),
            hints: Vec::new(),
            opt_level: 2,
            rules: RuleSet::all(),
            debug: false,
        }
    }
}

/// The typed signature, for the macro's glue.
#[derive(Clone, Debug)]
pub struct Signature {
    pub params: Vec<(String, DType, Shape)>,
    pub outputs: Vec<(DType, Shape)>,
    /// Whether the function returns a tuple (even of one).
    pub tuple_return: bool,
    /// The parameters that are caches (state written in place), by index (`Graph::state`).
    pub state: Vec<usize>,
    /// The dims the caller gives at each call, in order (`P: usize` parameters).
    pub call_dims: Vec<String>,
}

/// A producer's result: the graph (still holding sugar ops), options and signature.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub graph: Graph,
    pub options: Options,
    pub sig: Signature,
}

impl Signature {
    /// The signature of `g` as its parameters and outputs type it; `tuple_return` says whether
    /// the producer returns a tuple even of one output.
    pub fn of(g: &Graph, tuple_return: bool) -> Signature {
        let params = g
            .param_nodes()
            .iter()
            .zip(&g.params)
            .map(|(id, name)| (name.clone(), g.node(*id).dtype, g.node(*id).shape.clone()))
            .collect();
        let outputs =
            g.outputs.iter().map(|o| (g.node(*o).dtype, g.node(*o).shape.clone())).collect();
        let state = g.state.clone();
        let call_dims = g.caller_dims();
        Signature { params, outputs, tuple_return, state, call_dims }
    }
}

/// One graph with its options, checked and canonicalised: what every backend plans and
/// generates from. Made from the DSL (`Unit::parse`) or from any graph (`Unit::from_graph`).
#[derive(Clone, Debug)]
pub struct Unit {
    /// The producer's graph (with sugar ops), its options and signature.
    pub lowered: Lowered,
    /// The canonical graph (what plans and the reference interpreter run).
    pub graph: ir::Graph,
    /// Content hash of the graph and options: keys the build output.
    pub hash: String,
}

/// A planned and generated variant.
pub struct Built {
    pub variant: Variant,
    pub plan: plan::Plan,
    pub source: codegen::Source,
}

pub use autofusion_ir::hash::fingerprint;

impl Unit {
    /// A unit from a graph built by any producer (`GraphBuilder`, an importer). The graph is
    /// verified, then canonicalised; `options.dims` is not read (the graph carries its static
    /// dims already substituted).
    pub fn from_graph(graph: Graph, options: Options) -> Result<Unit, String> {
        let sig = Signature::of(&graph, graph.outputs.len() != 1);
        Unit::from_lowered(Lowered { graph, options, sig })
    }

    /// Verify, canonicalise and hash a producer's result.
    pub fn from_lowered(lowered: Lowered) -> Result<Unit, String> {
        ir::verify(&lowered.graph)?;
        let graph = canon::canonicalize(&lowered.graph);
        ir::verify(&graph).map_err(|e| format!("after canonicalisation: {e}"))?;
        let hash = unit_hash(&graph, &lowered.options);
        Ok(Unit { lowered, graph, hash })
    }

    pub fn name(&self) -> &str {
        &self.graph.name
    }

    /// The exported symbol of a variant's module descriptor.
    pub fn symbol(&self, v: Variant) -> String {
        symbol(&self.graph.name, &self.hash, v)
    }

    /// Plan one variant for `backend` (without the rules it cannot generate) and generate its
    /// source: the one call every backend is built through.
    pub fn build(&self, backend: &dyn Backend, v: Variant) -> Result<Built, String> {
        let o = &self.lowered.options;
        let level = match v {
            Variant::Fused => o.opt_level,
            Variant::Unfused => 0,
        };
        let (mut rules, unsupported) = (o.rules, backend.unsupported_rules());
        for r in plan::Rule::ALL.into_iter().filter(|r| unsupported.contains(*r)) {
            rules.remove(r);
        }
        let plan = plan::plan(&self.graph, level, rules, &o.hints, backend.profile());
        self.build_plan(backend, v, plan, &self.symbol(v))
    }

    /// Generate `backend`'s source for a plan of one's own (tools and benchmarks re-plan);
    /// `symbol` names the exported entries and must be unique in a process.
    pub fn build_plan(
        &self,
        backend: &dyn Backend,
        v: Variant,
        plan: plan::Plan,
        symbol: &str,
    ) -> Result<Built, String> {
        let source = backend.generate(self, v, &plan, symbol)?;
        Ok(Built { variant: v, plan, source })
    }

    /// `build` for the host with `target` (host generation cannot fail).
    pub fn variant(&self, v: Variant, target: &target::Target) -> Built {
        self.build(&Host::new(target.clone()), v).expect("host code generation does not fail")
    }
}

/// Content hash of a canonical graph and the options that change its code: keys the build
/// output and the exported symbols.
fn unit_hash(graph: &Graph, o: &Options) -> String {
    let key = format!(
        "{}|{}|opt{}|rules{}|debug{}|hints{:?}",
        env!("CARGO_PKG_VERSION"),
        graph.dump(),
        o.opt_level,
        o.rules.0,
        o.debug,
        o.hints
    );
    fingerprint(&key)
}

/// `af_<graph>_<hash>_<variant>`.
pub fn symbol(name: &str, hash: &str, v: Variant) -> String {
    format!("af_{name}_{hash}_{}", v.name())
}
