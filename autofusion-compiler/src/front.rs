//! The DSL front end: attribute options and the function body, lowered to IR with shape and
//! dtype inference. Every error of the phase is collected and spanned on the offending tokens.

use crate::builder::ConstPool;
use crate::diag::{Diag, Diags};
use crate::dim::{shape_str, DimExpr, Shape};
use crate::ir::{self, BinaryOp, DType, Graph, Node, NodeId, Op, ReduceKind, UnaryOp};
use crate::plan::{Rule, RuleSet};
pub use crate::unit::{Lowered, Options, Signature};
use proc_macro2::{Span, TokenStream};
use std::collections::HashMap;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Expr, Pat, Stmt};

pub fn parse_options(attr: TokenStream) -> Result<Options, Diags> {
    let mut opts = Options::default();
    let mut diags = Diags::default();
    let metas =
        syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated.parse2(attr)?;
    let mut seen: Vec<String> = Vec::new();
    for meta in metas {
        let key = meta.path().get_ident().map(|i| i.to_string()).unwrap_or_default();
        if seen.contains(&key) {
            diags.push(Diag::new(meta.path().span(), format!("option `{key}` given twice")));
            continue;
        }
        seen.push(key.clone());
        match (key.as_str(), &meta) {
            ("dims" | "hints", syn::Meta::List(l)) => {
                let parser = syn::punctuated::Punctuated::<syn::MetaNameValue, syn::Token![,]>::parse_terminated;
                match l.parse_args_with(parser) {
                    Ok(items) => {
                        for nv in items {
                            let name = nv.path.get_ident().map(|i| i.to_string());
                            let val = match &nv.value {
                                Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<i64>().ok(),
                                _ => None,
                            };
                            match (name, val) {
                                (Some(n), Some(v)) if v > 0 => {
                                    let list = if key == "dims" { &mut opts.dims } else { &mut opts.hints };
                                    if list.iter().any(|(m, _)| *m == n) {
                                        diags.push(Diag::new(nv.path.span(), format!("dim `{n}` given twice")));
                                    }
                                    list.push((n, v));
                                }
                                (None, _) => diags.push(Diag::new(nv.path.span(), "expected a dim name")),
                                (_, _) => diags.push(
                                    Diag::new(nv.value.span(), format!("bad value for a dim in `{key}(...)`: expected a positive integer literal"))
                                        .help(format!("write `{key}(D = 1024, H = 16)`")),
                                ),
                            }
                        }
                    }
                    Err(e) => diags.0.extend(Diags::from(e).0),
                }
            }
            ("opt_level", syn::Meta::NameValue(nv)) => match &nv.value {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) if matches!(i.base10_parse::<u8>(), Ok(0..=3)) => {
                    opts.opt_level = i.base10_parse().unwrap();
                }
                v => diags.push(
                    Diag::new(v.span(), format!("bad value for `opt_level`: `{}`", quote::quote!(#v)))
                        .help("opt_level is an integer from 0 (one kernel per op) to 3 (all fusions)"),
                ),
            },
            ("debug", syn::Meta::NameValue(nv)) => match &nv.value {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(b), .. }) => opts.debug = b.value,
                v => diags.push(Diag::new(v.span(), "bad value for `debug`: expected `true` or `false`")),
            },
            ("rules", syn::Meta::NameValue(nv)) => match &nv.value {
                Expr::Path(p) if p.path.is_ident("all") => opts.rules = RuleSet::all(),
                Expr::Path(p) if p.path.is_ident("none") => opts.rules = RuleSet::none(),
                Expr::Array(a) => {
                    let mut set = RuleSet::none();
                    for e in &a.elems {
                        let name = match e {
                            Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
                            _ => None,
                        };
                        match name.as_deref().and_then(Rule::parse) {
                            Some(r) => set.insert(r),
                            None => diags.push(
                                Diag::new(e.span(), format!("unknown fusion rule `{}`", quote::quote!(#e)))
                                    .help(format!("known rules: {}", Rule::ALL.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "))),
                            ),
                        }
                    }
                    opts.rules = set;
                }
                v => diags.push(
                    Diag::new(v.span(), "bad value for `rules`: expected `all`, `none` or a list like `[add_norm, linear_epilogue]`"),
                ),
            },
            _ => diags.push(
                Diag::new(meta.span(), format!("unknown option `{}`", quote::quote!(#meta)))
                    .help("options are dims(NAME = value, ...), hints(NAME = value, ...), opt_level = 0..=3, rules = all | none | [name, ...], debug = true | false"),
            ),
        }
    }
    if diags.is_empty() {
        Ok(opts)
    } else {
        Err(diags)
    }
}

/// A value while lowering.
#[derive(Clone)]
enum Val {
    T(NodeId),
    Scalar(f64),
    Tuple(Vec<NodeId>),
    /// A binding whose value had an error (already reported): uses stay silent.
    Poison,
}

struct Lower<'a> {
    opts: &'a Options,
    nodes: Vec<Node>,
    env: HashMap<String, Val>,
    diags: Diags,
    dyn_dims: Vec<String>,
    consts: ConstPool,
    cur_name: String,
    /// Parameters that are caches (`Cache<..>`), by parameter index, with their spans.
    state: Vec<(usize, Span)>,
    /// Dims the caller gives at each call (`P: usize` parameters), with their spans.
    call_dims: Vec<(String, Span)>,
    /// Set while lowering the cache argument of `cache_write`, the one place a cache is read.
    reading_cache: bool,
}

fn line_of(span: Span) -> u32 {
    span.start().line as u32
}

impl<'a> Lower<'a> {
    fn static_dim(&self, n: &str) -> Option<i64> {
        self.opts.dims.iter().find(|(m, _)| m == n).map(|(_, v)| *v)
    }

    /// Parse a dim expression; unknown names become dynamic dims when `allow_new`.
    fn dim(&mut self, e: &Expr, allow_new: bool) -> Option<DimExpr> {
        match e {
            Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => {
                match i.base10_parse::<i64>() {
                    Ok(v) if v >= 0 => Some(DimExpr::constant(v)),
                    _ => {
                        self.diags
                            .push(Diag::new(i.span(), "a dim must be a non-negative integer"));
                        None
                    }
                }
            }
            Expr::Path(p) if p.path.get_ident().is_some() => {
                let n = p.path.get_ident().unwrap().to_string();
                if let Some(v) = self.static_dim(&n) {
                    Some(DimExpr::constant(v))
                } else if self.dyn_dims.contains(&n) {
                    Some(DimExpr::sym(&n))
                } else if allow_new {
                    self.dyn_dims.push(n.clone());
                    Some(DimExpr::sym(&n))
                } else {
                    self.diags
                        .push(Diag::new(p.span(), format!("unknown dim `{n}`")).help(
                            "dims are bound in `dims(...)` or appear in a parameter's shape",
                        ));
                    None
                }
            }
            Expr::Paren(p) => self.dim(&p.expr, allow_new),
            Expr::Binary(b) => {
                let l = self.dim(&b.left, allow_new);
                let r = self.dim(&b.right, allow_new);
                let (l, r) = (l?, r?);
                match b.op {
                    syn::BinOp::Mul(_) => Some(l.mul(&r)),
                    syn::BinOp::Add(_) => Some(l.add(&r)),
                    syn::BinOp::Sub(_) => Some(l.sub(&r)),
                    syn::BinOp::Div(_) => {
                        match r.as_const() {
                            Some(k) if k != 0 => Some(l.div_const(k).unwrap()),
                            _ => {
                                self.diags.push(Diag::new(b.right.span(), "a dim can only be divided by a non-zero constant or static dim"));
                                None
                            }
                        }
                    }
                    _ => {
                        self.diags.push(Diag::new(
                            b.op.span(),
                            "unsupported operator in a dim expression",
                        ));
                        None
                    }
                }
            }
            _ => {
                self.diags.push(Diag::new(
                    e.span(),
                    "expected a dim expression (names, integers, `*`, `/`)",
                ));
                None
            }
        }
    }

    /// `Tensor<f32, {[S, D]}>` -> dtype and shape.
    fn tensor_type(&mut self, ty: &syn::Type, allow_new: bool) -> Option<(DType, Shape)> {
        let bad = |this: &mut Self, span: Span| {
            this.diags.push(
                Diag::new(span, "expected a tensor type like `Tensor<f32, {[S, D]}>`").help(
                    format!("the dtype is {}; the shape is a braced list of dims", DType::names()),
                ),
            );
            None
        };
        let syn::Type::Path(tp) = ty else { return bad(self, ty.span()) };
        let seg = tp.path.segments.last().unwrap();
        if seg.ident != "Tensor" && seg.ident != "Cache" {
            return bad(self, ty.span());
        }
        let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
            return bad(self, ty.span());
        };
        if args.args.len() != 2 {
            return bad(self, args.span());
        }
        let dtype = match &args.args[0] {
            syn::GenericArgument::Type(syn::Type::Path(p)) => {
                p.path.get_ident().and_then(|i| DType::parse(&i.to_string()))
            }
            _ => None,
        };
        let Some(dtype) = dtype else {
            self.diags.push(Diag::new(
                args.args[0].span(),
                format!("unknown dtype: expected {}", DType::names()),
            ));
            return None;
        };
        let shape_expr = match &args.args[1] {
            syn::GenericArgument::Const(Expr::Block(b)) if b.block.stmts.len() == 1 => {
                match &b.block.stmts[0] {
                    Stmt::Expr(Expr::Array(a), None) => Some(a.clone()),
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(arr) = shape_expr else {
            self.diags.push(
                Diag::new(args.args[1].span(), "expected a shape like `{[S, D]}`")
                    .help("rustc needs the braces: `[S, D]` alone is not a type"),
            );
            return None;
        };
        let mut shape = Vec::new();
        let mut ok = true;
        for e in &arr.elems {
            match self.dim(e, allow_new) {
                Some(d) => shape.push(d),
                None => ok = false,
            }
        }
        ok.then_some((dtype, shape))
    }

    fn push(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        dtype: DType,
        shape: Shape,
        span: Span,
    ) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            op,
            inputs,
            dtype,
            shape,
            name: self.cur_name.clone(),
            line: line_of(span),
        });
        id
    }

    fn ty(&self, id: NodeId) -> (&Shape, DType) {
        let n = &self.nodes[id.idx()];
        (&n.shape, n.dtype)
    }

    /// Emit `op` after inference; an error is spanned on the operand at fault.
    fn emit(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        spans: &[Span],
        whole: Span,
        target: Option<(DType, &Shape)>,
    ) -> Option<NodeId> {
        let ins: Vec<(&Shape, DType)> = inputs.iter().map(|i| self.ty(*i)).collect();
        match ir::infer(&op, &ins, target) {
            Ok((s, d)) => Some(self.push(op, inputs, d, s, whole)),
            Err(e) => {
                let span = e.operand.and_then(|i| spans.get(i).copied()).unwrap_or(whole);
                let mut d = Diag::new(span, e.msg);
                d.help = e.help;
                self.diags.push(d);
                None
            }
        }
    }

    /// Whether `id` is a cache parameter.
    fn is_cache(&self, id: NodeId) -> bool {
        matches!(self.nodes[id.idx()].op, Op::Param { index } if self.state.iter().any(|s| s.0 == index))
    }

    fn const_node(&mut self, v: f64, dtype: DType, span: Span) -> NodeId {
        if let Some(id) = self.consts.get(v, dtype) {
            return id;
        }
        let id = self.push(Op::Const { value: v }, vec![], dtype, vec![], span);
        self.nodes[id.idx()].name = format!("{v:?}");
        self.consts.insert(v, dtype, id);
        id
    }

    fn tensor(&mut self, v: Val, span: Span, what: &str) -> Option<NodeId> {
        match v {
            Val::T(id) if !self.reading_cache && self.is_cache(id) => {
                let name = self.nodes[id.idx()].name.clone();
                self.diags.push(
                    Diag::new(span, format!("cache `{name}` is read directly"))
                        .help(format!("a cache is read through what writes it: `let all = cache_write({name}, new, axis, P);`, then use `all`")),
                );
                None
            }
            Val::T(id) => Some(id),
            Val::Poison => None,
            Val::Scalar(_) => {
                self.diags
                    .push(Diag::new(span, format!("{what} must be a tensor, found a scalar")));
                None
            }
            Val::Tuple(_) => {
                self.diags.push(
                    Diag::new(span, format!("{what} must be a tensor, found a tuple"))
                        .help("destructure it first: `let (a, b) = split(x, 2, -1);`"),
                );
                None
            }
        }
    }

    fn scalar(&mut self, e: &Expr, what: &str) -> Option<f64> {
        match self.expr(e)? {
            Val::Scalar(v) => Some(v),
            Val::Poison => None,
            _ => {
                self.diags.push(Diag::new(e.span(), format!("{what} must be a constant scalar")));
                None
            }
        }
    }

    fn axis(&mut self, e: &Expr, rank: usize) -> Option<usize> {
        let v = match e {
            Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<i64>().ok(),
            Expr::Unary(syn::ExprUnary { op: syn::UnOp::Neg(_), expr, .. }) => match &**expr {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => {
                    i.base10_parse::<i64>().ok().map(|v| -v)
                }
                _ => None,
            },
            _ => None,
        };
        match v {
            Some(v) if v >= -(rank as i64) && v < rank as i64 => {
                Some(if v < 0 { (v + rank as i64) as usize } else { v as usize })
            }
            Some(v) => {
                self.diags.push(Diag::new(
                    e.span(),
                    format!("axis {v} is out of range for a tensor of rank {rank}"),
                ));
                None
            }
            None => {
                self.diags.push(Diag::new(
                    e.span(),
                    "expected an integer axis (negative counts from the end)",
                ));
                None
            }
        }
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        a: Val,
        b: Val,
        sa: Span,
        sb: Span,
        whole: Span,
    ) -> Option<Val> {
        match (a, b) {
            (Val::Poison, _) | (_, Val::Poison) => None,
            (Val::Scalar(x), Val::Scalar(y)) => Some(Val::Scalar(op.eval(x, y))),
            (a, b) => {
                let dtype = match (&a, &b) {
                    (Val::T(i), _) | (_, Val::T(i)) => self.nodes[i.idx()].dtype,
                    _ => DType::F32,
                };
                let ta = self.operand(a, dtype, sa);
                let tb = self.operand(b, dtype, sb);
                let (ta, tb) = (ta?, tb?);
                self.emit(Op::Binary(op), vec![ta, tb], &[sa, sb], whole, None).map(Val::T)
            }
        }
    }

    /// A tensor operand, or a number as a constant of `dtype` (the other operand's type).
    fn operand(&mut self, v: Val, dtype: DType, span: Span) -> Option<NodeId> {
        match v {
            Val::Scalar(x) => self.number(x, dtype, span),
            v => self.tensor(v, span, "an operand"),
        }
    }

    /// The number `x` as a constant of `dtype`. Integer tensors take whole numbers in their
    /// range (never a silent truncation of `0.5`); a `bool` tensor takes no number at all.
    fn number(&mut self, x: f64, dtype: DType, span: Span) -> Option<NodeId> {
        let fits = match dtype {
            DType::I64 => x.fract() == 0.0 && x.abs() < 9.223_372_036_854_776e18,
            DType::I32 => x.fract() == 0.0 && (i32::MIN as f64..=i32::MAX as f64).contains(&x),
            DType::Bool => false,
            _ => true,
        };
        if fits {
            return Some(self.const_node(x, dtype, span));
        }
        let d = if dtype == DType::Bool {
            Diag::new(span, format!("the number {x} meets a bool operand"))
                .help("compare the bool tensor's source instead, or convert it: `cast(m, i64)`")
        } else {
            Diag::new(span, format!("the number {x} is not an {dtype} value"))
                .help(format!("{dtype} operands take whole numbers in range; to compute in floating point, `cast(x, f32)` first"))
        };
        self.diags.push(d);
        None
    }

    /// `name(a, b)` for an elementwise binary op by its table name, or `ne` (not `eq`).
    fn binary_named(
        &mut self,
        name: &str,
        a: Val,
        b: Val,
        sa: Span,
        sb: Span,
        whole: Span,
    ) -> Option<Val> {
        if name == "ne" {
            return match self.binary(BinaryOp::Eq, a, b, sa, sb, whole)? {
                Val::Scalar(v) => Some(Val::Scalar(UnaryOp::Not.eval(v))),
                v => {
                    let t = self.tensor(v, whole, "a comparison")?;
                    self.emit(Op::Unary(UnaryOp::Not), vec![t], &[whole], whole, None).map(Val::T)
                }
            };
        }
        let op = *BinaryOp::ALL.iter().find(|o| o.name() == name).expect("a binary op name");
        self.binary(op, a, b, sa, sb, whole)
    }

    fn expr(&mut self, e: &Expr) -> Option<Val> {
        match e {
            Expr::Lit(syn::ExprLit { lit: syn::Lit::Float(f), .. }) => {
                f.base10_parse::<f64>().ok().map(Val::Scalar)
            }
            Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => {
                i.base10_parse::<f64>().ok().map(Val::Scalar)
            }
            Expr::Paren(p) => self.expr(&p.expr),
            Expr::Path(p) if p.path.get_ident().is_some() => {
                let n = p.path.get_ident().unwrap().to_string();
                if let Some(v) = self.env.get(&n) {
                    return Some(v.clone());
                }
                if let Some(v) = self.static_dim(&n) {
                    return Some(Val::Scalar(v as f64));
                }
                let mut d = Diag::new(p.span(), format!("unknown variable `{n}`"));
                if let Some(close) = suggest(&n, self.env.keys().map(|k| k.as_str())) {
                    d = d.help(format!("a variable with a similar name exists: `{close}`"));
                }
                self.diags.push(d);
                None
            }
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => match self.expr(&u.expr)? {
                Val::Scalar(v) => Some(Val::Scalar(-v)),
                Val::Poison => None,
                v => {
                    let t = self.tensor(v, u.expr.span(), "the operand of `-`")?;
                    self.emit(Op::Unary(UnaryOp::Neg), vec![t], &[u.expr.span()], e.span(), None)
                        .map(Val::T)
                }
            },
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Not(_)) => match self.expr(&u.expr)? {
                Val::Scalar(v) => Some(Val::Scalar(UnaryOp::Not.eval(v))),
                Val::Poison => None,
                v => {
                    let t = self.tensor(v, u.expr.span(), "the operand of `!`")?;
                    self.emit(Op::Unary(UnaryOp::Not), vec![t], &[u.expr.span()], e.span(), None)
                        .map(Val::T)
                }
            },
            Expr::Binary(b) => {
                let op = match b.op {
                    syn::BinOp::Add(_) => "add",
                    syn::BinOp::Sub(_) => "sub",
                    syn::BinOp::Mul(_) => "mul",
                    syn::BinOp::Div(_) => "div",
                    syn::BinOp::Eq(_) => "eq",
                    syn::BinOp::Ne(_) => "ne",
                    syn::BinOp::Lt(_) => "lt",
                    syn::BinOp::Le(_) => "le",
                    syn::BinOp::Gt(_) => "gt",
                    syn::BinOp::Ge(_) => "ge",
                    syn::BinOp::BitAnd(_) | syn::BinOp::And(_) => "and",
                    syn::BinOp::BitOr(_) | syn::BinOp::Or(_) => "or",
                    _ => {
                        self.diags.push(
                            Diag::new(
                                b.op.span(),
                                format!(
                                    "unsupported operator `{}`",
                                    quote::quote!(#b.op).to_string().trim()
                                ),
                            )
                            .help("tensor expressions use + - * /, comparisons == != < <= > >=, & | ! on bools, and function calls"),
                        );
                        return None;
                    }
                };
                let l = self.expr(&b.left);
                let r = self.expr(&b.right);
                self.binary_named(op, l?, r?, b.left.span(), b.right.span(), e.span())
            }
            Expr::Call(c) => self.call(c),
            Expr::Tuple(t) => {
                let mut ids = Vec::new();
                for el in &t.elems {
                    let v = self.expr(el)?;
                    ids.push(self.tensor(v, el.span(), "a tuple element")?);
                }
                Some(Val::Tuple(ids))
            }
            Expr::MethodCall(m) => {
                self.diags.push(
                    Diag::new(
                        m.method.span(),
                        format!("method calls are not supported: `.{}()`", m.method),
                    )
                    .help(format!("call the op as a function: `{}(x, ...)`", m.method)),
                );
                None
            }
            _ => {
                self.diags.push(
                    Diag::new(
                        e.span(),
                        format!(
                            "unsupported expression `{}`",
                            short(&quote::quote!(#e).to_string())
                        ),
                    )
                    .help("a graph body uses variables, literals, + - * / and op calls"),
                );
                None
            }
        }
    }

    fn call(&mut self, c: &syn::ExprCall) -> Option<Val> {
        let Expr::Path(fp) = &*c.func else {
            self.diags.push(Diag::new(c.func.span(), "expected an op name"));
            return None;
        };
        let Some(ident) = fp.path.get_ident() else {
            self.diags.push(Diag::new(fp.span(), "expected an op name, not a path"));
            return None;
        };
        let k = Call::new(c, ident.to_string());
        let (name, args, spans, whole) = (&k.name, &k.args, &k.spans, k.whole);
        let arity = |this: &mut Self, want: &str, ok: bool| k.arity(this, want, ok);
        let tensors = |this: &mut Self, idx: &[usize]| k.tensors(this, idx);
        if let Some(u) = UnaryOp::ALL.iter().find(|u| u.name() == name) {
            if !arity(self, "1 argument", args.len() == 1) {
                return None;
            }
            return match self.expr(args[0])? {
                Val::Scalar(v) => Some(Val::Scalar(u.eval(v))),
                Val::Poison => None,
                v => {
                    let t = self.tensor(v, spans[0], "the operand")?;
                    self.emit(Op::Unary(*u), vec![t], spans, whole, None).map(Val::T)
                }
            };
        }
        match name.as_str() {
            n if BINARY_FNS.contains(&n)
                && args.len() == 2
                && !(n == "max" && is_int_lit(args[1])) =>
            {
                let a = self.expr(args[0]);
                let b = self.expr(args[1]);
                self.binary_named(n, a?, b?, spans[0], spans[1], whole)
            }
            n if BINARY_FNS.contains(&n) && n != "max" => {
                arity(self, "2 arguments", false);
                None
            }
            "sum" | "mean" | "max" | "softmax" => {
                if !arity(self, "2 arguments (tensor, axis)", args.len() == 2) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let axis = self.axis(args[1], self.ty(t).0.len())?;
                let op = match name.as_str() {
                    "sum" => Op::Reduce { kind: ReduceKind::Sum, axis },
                    "mean" => Op::Reduce { kind: ReduceKind::Mean, axis },
                    "max" => Op::Reduce { kind: ReduceKind::Max, axis },
                    _ => Op::Softmax { axis },
                };
                self.emit(op, vec![t], spans, whole, None).map(Val::T)
            }
            "matmul" => {
                if !arity(self, "2 arguments", args.len() == 2) {
                    return None;
                }
                let ts = tensors(self, &[0, 1])?;
                self.emit(Op::MatMul, ts, spans, whole, None).map(Val::T)
            }
            "linear" => {
                if !arity(self, "3 arguments (x, w, b)", args.len() == 3) {
                    return None;
                }
                let ts = tensors(self, &[0, 1, 2])?;
                self.emit(Op::Linear, ts, spans, whole, None).map(Val::T)
            }
            "layer_norm" | "rms_norm" => {
                let n = if name == "layer_norm" { 4 } else { 3 };
                if !arity(
                    self,
                    if n == 4 {
                        "4 arguments (x, gamma, beta, eps)"
                    } else {
                        "3 arguments (x, gamma, eps)"
                    },
                    args.len() == n,
                ) {
                    return None;
                }
                let ts = tensors(self, &(0..n - 1).collect::<Vec<_>>());
                let eps = self.scalar(args[n - 1], "eps");
                let (ts, eps) = (ts?, eps?);
                let op = if n == 4 { Op::LayerNorm { eps } } else { Op::RmsNorm { eps } };
                self.emit(op, ts, spans, whole, None).map(Val::T)
            }
            "cast" => {
                if !arity(self, "2 arguments (x, dtype)", args.len() == 2) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let d = match args[1] {
                    Expr::Path(p) => p.path.get_ident().and_then(|i| DType::parse(&i.to_string())),
                    _ => None,
                };
                let Some(d) = d else {
                    self.diags
                        .push(Diag::new(spans[1], format!("expected a dtype: {}", DType::names())));
                    return None;
                };
                let s = self.ty(t).0.clone();
                self.emit(Op::Cast, vec![t], spans, whole, Some((d, &s))).map(Val::T)
            }
            "where_" | "gather" | "cumsum" | "expand" => self.call_indexing(&k),
            "cache_write" => self.call_cache_write(&k),
            "causal_mask" => {
                if !arity(self, "1 argument", args.len() == 1) {
                    return None;
                }
                let t = tensors(self, &[0])?;
                self.emit(Op::CausalMask, t, spans, whole, None).map(Val::T)
            }
            "reshape" | "transpose" | "slice" | "split" | "concat" | "split_heads"
            | "merge_heads" => self.call_layout(&k),
            "attention" | "rope" => self.call_sugar(&k),
            _ => {
                let mut d = Diag::new(ident.span(), format!("unknown op `{name}`"));
                if let Some(k) = suggest(name, KNOWN_OPS.iter().copied()) {
                    d = d.help(format!("did you mean `{k}`?"));
                } else {
                    d = d.help("see the op table in the autofusion docs: matmul, linear, layer_norm, softmax, silu, ...");
                }
                self.diags.push(d);
                // Still lower the arguments, to report their errors too.
                for a in args.iter() {
                    let _ = self.expr(a);
                }
                None
            }
        }
    }

    /// Ops of token ids and masks: `where_`, `gather`, `cumsum`, `expand`.
    fn call_indexing(&mut self, k: &Call) -> Option<Val> {
        let (name, args, spans, whole) = (&k.name, &k.args, &k.spans, k.whole);
        let arity = |this: &mut Self, want: &str, ok: bool| k.arity(this, want, ok);
        let tensors = |this: &mut Self, idx: &[usize]| k.tensors(this, idx);
        match name.as_str() {
            "where_" => {
                if !arity(self, "3 arguments (cond, a, b)", args.len() == 3) {
                    return None;
                }
                let cond = tensors(self, &[0]);
                let a = self.expr(args[1]);
                let b = self.expr(args[2]);
                let (cond, a, b) = (cond?[0], a?, b?);
                // A number takes the type of the other branch (f32 when both are numbers).
                let dtype = match (&a, &b) {
                    (Val::T(i), _) | (_, Val::T(i)) => self.nodes[i.idx()].dtype,
                    _ => DType::F32,
                };
                let ta = self.operand(a, dtype, spans[1]);
                let tb = self.operand(b, dtype, spans[2]);
                let ins = vec![cond, ta?, tb?];
                self.emit(Op::Where, ins, spans, whole, None).map(Val::T)
            }
            "gather" => {
                if !arity(
                    self,
                    "2 or 3 arguments (table, ids[, axis])",
                    matches!(args.len(), 2 | 3),
                ) {
                    return None;
                }
                let ts = tensors(self, &[0, 1])?;
                let axis = match args.get(2) {
                    Some(a) => self.axis(a, self.ty(ts[0]).0.len())?,
                    None => 0,
                };
                self.emit(Op::Gather { axis }, ts, spans, whole, None).map(Val::T)
            }
            "cumsum" => {
                if !arity(
                    self,
                    "2 or 3 arguments (x, axis[, exclusive])",
                    matches!(args.len(), 2 | 3),
                ) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let axis = self.axis(args[1], self.ty(t).0.len())?;
                let exclusive = match args.get(2) {
                    None => false,
                    Some(Expr::Path(p)) if p.path.is_ident("exclusive") => true,
                    Some(e) => {
                        self.diags.push(
                            Diag::new(e.span(), "expected `exclusive` as the third argument of `cumsum`")
                                .help("`cumsum(x, axis)` sums 0..=i, `cumsum(x, axis, exclusive)` sums 0..i"),
                        );
                        return None;
                    }
                };
                self.emit(Op::CumSum { axis, exclusive }, vec![t], spans, whole, None).map(Val::T)
            }
            "expand" => {
                if !arity(self, "2 arguments (x, [dims])", args.len() == 2) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let shape = self.dim_list(args[1], "[B, 1, S, S]")?;
                self.emit(Op::Expand { shape }, vec![t], spans, whole, None).map(Val::T)
            }
            _ => unreachable!("`{name}` is dispatched to call_indexing by `call`"),
        }
    }

    /// A list of known dims (`[S, H, D / H]`, like `example`): a target shape.
    fn dim_list(&mut self, e: &Expr, example: &str) -> Option<Shape> {
        let Expr::Array(arr) = e else {
            self.diags
                .push(Diag::new(e.span(), format!("expected a list of dims like `{example}`")));
            return None;
        };
        arr.elems.iter().map(|el| self.dim(el, false)).collect()
    }

    /// Layout ops: views (`reshape`, `transpose`, `slice`, `split`, `split_heads`, `merge_heads`) and `concat`.
    fn call_layout(&mut self, k: &Call) -> Option<Val> {
        match k.name.as_str() {
            "reshape" | "transpose" => self.call_reshape_transpose(k),
            "slice" | "split" => self.call_slice_split(k),
            "concat" => self.call_concat(k),
            "split_heads" | "merge_heads" => self.call_heads(k),
            name => unreachable!("`{name}` is dispatched to call_layout by `call`"),
        }
    }

    /// `reshape` to a list of dims and `transpose` of two axes.
    fn call_reshape_transpose(&mut self, k: &Call) -> Option<Val> {
        let (name, args, spans, whole) = (&k.name, &k.args, &k.spans, k.whole);
        let arity = |this: &mut Self, want: &str, ok: bool| k.arity(this, want, ok);
        let tensors = |this: &mut Self, idx: &[usize]| k.tensors(this, idx);
        match name.as_str() {
            "reshape" => {
                if !arity(self, "2 arguments (x, [dims])", args.len() == 2) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let shape = self.dim_list(args[1], "[S, H, D / H]")?;
                let d = self.ty(t).1;
                self.emit(Op::Reshape, vec![t], spans, whole, Some((d, &shape))).map(Val::T)
            }
            "transpose" => {
                if !arity(self, "3 arguments (x, axis_a, axis_b)", args.len() == 3) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let r = self.ty(t).0.len();
                let a = self.axis(args[1], r);
                let b = self.axis(args[2], r);
                let (a, b) = (a?, b?);
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(a, b);
                self.emit(Op::Transpose { perm }, vec![t], spans, whole, None).map(Val::T)
            }
            _ => unreachable!("`{name}` is dispatched to call_reshape_transpose by `call_layout`"),
        }
    }

    /// `slice` of one axis and `split` into equal parts (a tuple of slices).
    /// `cache_write(cache, new, axis, start)`: `new` written into the cache parameter at
    /// `start` along `axis`; the cache after the write.
    fn call_cache_write(&mut self, k: &Call) -> Option<Val> {
        let (args, spans, whole) = (&k.args, &k.spans, k.whole);
        if !k.arity(self, "4 arguments (cache, new, axis, start)", args.len() == 4) {
            return None;
        }
        self.reading_cache = true;
        let cache = k.tensors(self, &[0]);
        self.reading_cache = false;
        let new = k.tensors(self, &[1]);
        let (cache, new) = (cache?[0], new?[0]);
        if !self.is_cache(cache) {
            self.diags.push(
                Diag::new(
                    spans[0],
                    "the first argument of `cache_write` must be a cache parameter",
                )
                .help("declare it as `name: Cache<f32, {[KVH, 1, T, DH]}>`"),
            );
            return None;
        }
        let axis = self.axis(args[2], self.ty(cache).0.len())?;
        let start = self.dim(args[3], false)?;
        self.emit(Op::CacheWrite { axis, start }, vec![cache, new], spans, whole, None).map(Val::T)
    }

    fn call_slice_split(&mut self, k: &Call) -> Option<Val> {
        let (name, args, spans, whole) = (&k.name, &k.args, &k.spans, k.whole);
        let arity = |this: &mut Self, want: &str, ok: bool| k.arity(this, want, ok);
        let tensors = |this: &mut Self, idx: &[usize]| k.tensors(this, idx);
        match name.as_str() {
            "slice" => {
                if !arity(self, "4 arguments (x, axis, start, end)", args.len() == 4) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let axis = self.axis(args[1], self.ty(t).0.len())?;
                let start = self.dim(args[2], false)?;
                let end = self.dim(args[3], false)?;
                let extent = self.ty(t).0[axis].clone();
                if let (Some(s), Some(e), Some(x)) =
                    (start.as_const(), end.as_const(), extent.as_const())
                {
                    if !(s <= e && e <= x) {
                        self.diags.push(Diag::new(
                            args[2].span().join(args[3].span()).unwrap_or(whole),
                            format!("slice [{s}, {e}) is out of bounds for an axis of extent {x}"),
                        ));
                        return None;
                    }
                }
                self.emit(Op::Slice { axis, start, end }, vec![t], spans, whole, None).map(Val::T)
            }
            "split" => {
                if !arity(self, "3 arguments (x, parts, axis)", args.len() == 3) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let n = match args[1] {
                    Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => {
                        i.base10_parse::<i64>().ok().filter(|v| *v > 0)
                    }
                    _ => None,
                };
                let Some(n) = n else {
                    self.diags
                        .push(Diag::new(spans[1], "expected a positive integer number of parts"));
                    return None;
                };
                let axis = self.axis(args[2], self.ty(t).0.len())?;
                let ext = self.ty(t).0[axis].clone();
                let part = ext.div_const(n).unwrap();
                if ext.as_const().is_some_and(|x| x % n != 0) {
                    self.diags.push(Diag::new(
                        spans[1],
                        format!("axis of extent {ext} does not split into {n} equal parts"),
                    ));
                    return None;
                }
                let mut outs = Vec::new();
                for i in 0..n {
                    let start = part.mul(&DimExpr::constant(i));
                    let end = part.mul(&DimExpr::constant(i + 1));
                    outs.push(self.emit(
                        Op::Slice { axis, start, end },
                        vec![t],
                        spans,
                        whole,
                        None,
                    )?);
                }
                Some(Val::Tuple(outs))
            }
            _ => unreachable!("`{name}` is dispatched to call_slice_split by `call_layout`"),
        }
    }

    /// `concat` of a list of tensors along an axis.
    fn call_concat(&mut self, k: &Call) -> Option<Val> {
        let (args, spans, whole) = (&k.args, &k.spans, k.whole);
        let arity = |this: &mut Self, want: &str, ok: bool| k.arity(this, want, ok);
        if !arity(self, "2 arguments ([a, b, ...], axis)", args.len() == 2) {
            return None;
        }
        let Expr::Array(arr) = args[0] else {
            self.diags.push(Diag::new(spans[0], "expected a list of tensors like `[a, b]`"));
            return None;
        };
        let mut ts = Vec::new();
        let mut sp = Vec::new();
        for el in &arr.elems {
            let v = self.expr(el)?;
            ts.push(self.tensor(v, el.span(), "a concat operand")?);
            sp.push(el.span());
        }
        if ts.is_empty() {
            self.diags.push(Diag::new(spans[0], "concat needs at least one tensor"));
            return None;
        }
        let axis = self.axis(args[1], self.ty(ts[0]).0.len())?;
        self.emit(Op::Concat { axis }, ts, &sp, whole, None).map(Val::T)
    }

    /// `split_heads` ([.., S, D] to [.., H, S, D / H]) and its inverse `merge_heads`.
    fn call_heads(&mut self, k: &Call) -> Option<Val> {
        let (name, args, spans, whole) = (&k.name, &k.args, &k.spans, k.whole);
        let arity = |this: &mut Self, want: &str, ok: bool| k.arity(this, want, ok);
        let tensors = |this: &mut Self, idx: &[usize]| k.tensors(this, idx);
        match name.as_str() {
            "split_heads" => {
                if !arity(self, "2 arguments (x, heads)", args.len() == 2) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let h = self.dim(args[1], false)?;
                let (s, d) = (self.ty(t).0.clone(), self.ty(t).1);
                if s.len() < 2 {
                    self.diags.push(Diag::new(
                        spans[0],
                        format!("split_heads needs rank >= 2, got {}", shape_str(&s)),
                    ));
                    return None;
                }
                let r = s.len();
                let Some(dh) = s[r - 1].div(&h).filter(|q| {
                    q.mul(&h) == s[r - 1]
                        && s[r - 1].as_const().zip(h.as_const()).is_none_or(|(a, b)| a % b == 0)
                }) else {
                    self.diags.push(Diag::new(
                        spans[1],
                        format!("{} heads do not divide the last axis of {}", h, shape_str(&s)),
                    ));
                    return None;
                };
                let mut to = s[..r - 1].to_vec();
                to.push(h);
                to.push(dh);
                let x = self.emit(Op::Reshape, vec![t], spans, whole, Some((d, &to)))?;
                let mut perm: Vec<usize> = (0..r + 1).collect();
                perm.swap(r - 2, r - 1);
                self.emit(Op::Transpose { perm }, vec![x], spans, whole, None).map(Val::T)
            }
            "merge_heads" => {
                if !arity(self, "1 argument", args.len() == 1) {
                    return None;
                }
                let t = tensors(self, &[0])?[0];
                let (s, d) = (self.ty(t).0.clone(), self.ty(t).1);
                let r = s.len();
                if r < 3 {
                    self.diags.push(Diag::new(
                        spans[0],
                        format!(
                            "merge_heads needs rank >= 3 ([.., H, S, Dh]), got {}",
                            shape_str(&s)
                        ),
                    ));
                    return None;
                }
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(r - 3, r - 2);
                let x = self.emit(Op::Transpose { perm }, vec![t], spans, whole, None)?;
                let mut to = s[..r - 3].to_vec();
                to.push(s[r - 2].clone());
                to.push(s[r - 3].mul(&s[r - 1]));
                self.emit(Op::Reshape, vec![x], spans, whole, Some((d, &to))).map(Val::T)
            }
            _ => unreachable!("`{name}` is dispatched to call_heads by `call_layout`"),
        }
    }

    /// Sugar expanded by canonicalisation: `attention`, `rope`.
    fn call_sugar(&mut self, k: &Call) -> Option<Val> {
        let (name, args, spans, whole) = (&k.name, &k.args, &k.spans, k.whole);
        let arity = |this: &mut Self, want: &str, ok: bool| k.arity(this, want, ok);
        let tensors = |this: &mut Self, idx: &[usize]| k.tensors(this, idx);
        match name.as_str() {
            "attention" => {
                if !arity(
                    self,
                    "5 arguments (q, k, v, scale, causal | mask)",
                    args.len() == 5 || args.len() == 4,
                ) {
                    return None;
                }
                let ts = tensors(self, &[0, 1, 2]);
                let scale = self.scalar(args[3], "the attention scale");
                let mut ts = ts?;
                let scale = scale?;
                let (causal, mask) = match args.get(4) {
                    None => (false, false),
                    Some(Expr::Path(p)) if p.path.is_ident("causal") => (true, false),
                    Some(m) => {
                        let v = self.expr(m)?;
                        ts.push(self.tensor(v, m.span(), "the attention mask")?);
                        (false, true)
                    }
                };
                self.emit(Op::Attention { scale, causal, mask }, ts, spans, whole, None).map(Val::T)
            }
            "rope" => {
                if !arity(self, "3 arguments (x, cos, sin)", args.len() == 3) {
                    return None;
                }
                let ts = tensors(self, &[0, 1, 2])?;
                self.emit(Op::Rope, ts, spans, whole, None).map(Val::T)
            }
            _ => unreachable!("`{name}` is dispatched to call_sugar by `call`"),
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Local(l) => {
                let Some(init) = &l.init else {
                    self.diags.push(Diag::new(l.span(), "a `let` in a graph needs a value"));
                    return;
                };
                if let Some((_, div)) = &init.diverge {
                    self.diags
                        .push(Diag::new(div.span(), "`let ... else` is not supported in a graph"));
                    return;
                }
                match &l.pat {
                    Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                        if let Some(m) = &pi.mutability {
                            self.diags.push(
                                Diag::new(
                                    m.span(),
                                    "`let mut` is not supported: graph values are immutable",
                                )
                                .help("bind each step to a new name: `let h2 = silu(h);`"),
                            );
                        }
                        self.cur_name = pi.ident.to_string();
                        let v = self.expr(&init.expr).unwrap_or(Val::Poison);
                        self.env.insert(pi.ident.to_string(), v);
                    }
                    Pat::Tuple(pt) => {
                        let names: Option<Vec<_>> = pt
                            .elems
                            .iter()
                            .map(|p| match p {
                                Pat::Ident(pi) if pi.mutability.is_none() => Some(pi.ident.clone()),
                                _ => None,
                            })
                            .collect();
                        let Some(names) = names else {
                            self.diags.push(Diag::new(
                                pt.span(),
                                "expected a tuple of names like `(q, k, v)`",
                            ));
                            return;
                        };
                        self.cur_name =
                            names.iter().map(|n| n.to_string()).collect::<Vec<_>>().join("_");
                        match self.expr(&init.expr) {
                            Some(Val::Tuple(ids)) if ids.len() == names.len() => {
                                for (n, id) in names.iter().zip(ids) {
                                    self.nodes[id.idx()].name = n.to_string();
                                    self.env.insert(n.to_string(), Val::T(id));
                                }
                            }
                            other => {
                                match other {
                                    Some(Val::Tuple(ids)) => self.diags.push(Diag::new(
                                        pt.span(),
                                        format!(
                                            "the pattern binds {} names but the value has {} parts",
                                            names.len(),
                                            ids.len()
                                        ),
                                    )),
                                    Some(Val::Poison) | None => {}
                                    Some(_) => self.diags.push(Diag::new(
                                        init.expr.span(),
                                        "expected a tuple value (from `split`)",
                                    )),
                                }
                                for n in &names {
                                    self.env.insert(n.to_string(), Val::Poison);
                                }
                            }
                        }
                    }
                    p => self.diags.push(Diag::new(
                        p.span(),
                        "unsupported pattern: a graph binds `let name = ...` or `let (a, b) = ...`",
                    )),
                }
            }
            Stmt::Expr(e, _) => {
                let what = match e {
                    Expr::ForLoop(_) | Expr::While(_) | Expr::Loop(_) => "loops are",
                    Expr::If(_) | Expr::Match(_) => "control flow is",
                    Expr::Assign(_) => "assignment is",
                    _ => "statements other than `let` are",
                };
                self.diags.push(
                    Diag::new(
                        e.span(),
                        format!("unsupported statement: {what} not allowed in a fused graph"),
                    )
                    .help("a graph body is a sequence of `let` bindings and a tail expression"),
                );
            }
            Stmt::Macro(m) => self.diags.push(
                Diag::new(
                    m.span(),
                    "unsupported statement: macros are not allowed in a fused graph",
                )
                .help("a graph body is a sequence of `let` bindings and a tail expression"),
            ),
            Stmt::Item(i) => self.diags.push(Diag::new(
                i.span(),
                "unsupported statement: items are not allowed in a fused graph",
            )),
        }
    }
}

/// One DSL call being lowered: the op name, its arguments and their spans.
struct Call<'c> {
    c: &'c syn::ExprCall,
    name: String,
    args: Vec<&'c Expr>,
    spans: Vec<Span>,
    whole: Span,
}

impl<'c> Call<'c> {
    fn new(c: &'c syn::ExprCall, name: String) -> Call<'c> {
        let args: Vec<&Expr> = c.args.iter().collect();
        let spans = args.iter().map(|a| a.span()).collect();
        Call { c, name, args, spans, whole: c.span() }
    }

    /// Whether the argument count is right (`ok`); if not, an error saying what `want`s.
    fn arity(&self, lw: &mut Lower, want: &str, ok: bool) -> bool {
        if !ok {
            lw.diags.push(
                Diag::new(
                    self.c.paren_token.span.join(),
                    format!("`{}` takes {want}, {} given", self.name, self.args.len()),
                )
                .help(format!("usage: {}", usage(&self.name))),
            );
        }
        ok
    }

    /// Lower the tensor arguments `idx` once, reporting every argument error.
    fn tensors(&self, lw: &mut Lower, idx: &[usize]) -> Option<Vec<NodeId>> {
        let mut out = Vec::new();
        let mut ok = true;
        for &i in idx {
            let what = format!("argument {} of `{}`", i + 1, self.name);
            match lw.expr(self.args[i]).and_then(|v| lw.tensor(v, self.args[i].span(), &what)) {
                Some(t) => out.push(t),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}

/// The last path segment of a type (`Tensor`, `Cache`, `usize`).
fn type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(tp) => tp.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

fn is_int_lit(e: &Expr) -> bool {
    match e {
        Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(_), .. }) => true,
        Expr::Unary(u) => matches!(&*u.expr, Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(_), .. })),
        _ => false,
    }
}

fn short(s: &str) -> String {
    if s.len() > 40 {
        format!("{}...", &s[..s.char_indices().nth(37).map(|(i, _)| i).unwrap_or(s.len())])
    } else {
        s.to_string()
    }
}

/// Optimal-string-alignment distance (edits and adjacent transpositions).
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// The closest candidate worth suggesting for a misspelt `name`.
fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = if name.chars().count() <= 3 { 1 } else { 2 };
    candidates
        .filter(|c| *c != name && c.chars().count() >= 3)
        .map(|c| (distance(c, name), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c)
}

/// The elementwise binary ops called by name: `max(x, k)` with an integer literal `k` is the
/// reduction along axis `k` instead, and `ne(a, b)` is `not(eq(a, b))`.
const BINARY_FNS: &[&str] = &["pow", "max", "min", "eq", "ne", "lt", "le", "gt", "ge", "and", "or"];

pub const KNOWN_OPS: &[&str] = &[
    "matmul",
    "linear",
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "pow",
    "max",
    "min",
    "cast",
    "sum",
    "mean",
    "softmax",
    "layer_norm",
    "rms_norm",
    "reshape",
    "transpose",
    "split",
    "concat",
    "slice",
    "split_heads",
    "merge_heads",
    "attention",
    "rope",
    "causal_mask",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "and",
    "or",
    "not",
    "where_",
    "gather",
    "cumsum",
    "expand",
    "cache_write",
];

fn usage(op: &str) -> &'static str {
    match op {
        "matmul" => "matmul(a, b)",
        "linear" => "linear(x, w, b)",
        "layer_norm" => "layer_norm(x, gamma, beta, eps)",
        "rms_norm" => "rms_norm(x, gamma, eps)",
        "sum" | "mean" | "max" => "sum(x, axis), mean(x, axis), max(x, axis) or max(a, b)",
        "softmax" => "softmax(x, axis)",
        "pow" | "min" => "pow(a, b), min(a, b)",
        "eq" | "ne" | "lt" | "le" | "gt" | "ge" => {
            "eq(a, b) or a == b; ne, lt, le, gt, ge likewise"
        }
        "and" | "or" => "and(a, b) or a & b, or(a, b) or a | b, on bool tensors",
        "where_" => "where_(cond, a, b)",
        "gather" => "gather(table, ids) or gather(x, ids, axis)",
        "cumsum" => "cumsum(x, axis) or cumsum(x, axis, exclusive)",
        "expand" => "expand(x, [B, 1, S, S])",
        "cache_write" => "cache_write(k_cache, k, 2, P)",
        "cast" => "cast(x, f16), cast(ids, i64), cast(m, bool)",
        "reshape" => "reshape(x, [S, H, D / H])",
        "transpose" => "transpose(x, -2, -1)",
        "slice" => "slice(x, axis, start, end)",
        "split" => "let (a, b) = split(x, 2, -1)",
        "concat" => "concat([a, b], axis)",
        "split_heads" => "split_heads(x, H)",
        "merge_heads" => "merge_heads(x)",
        "attention" => "attention(q, k, v, scale, causal) or attention(q, k, v, scale, mask)",
        "rope" => "rope(x, cos, sin)",
        _ => "op(x)",
    }
}

/// Lower one `#[fused_graph]` function.
pub fn lower(opts: Options, f: &syn::ItemFn) -> Result<Lowered, Diags> {
    let mut lw = Lower {
        opts: &opts,
        nodes: Vec::new(),
        env: HashMap::new(),
        diags: Diags::default(),
        dyn_dims: Vec::new(),
        consts: ConstPool::default(),
        cur_name: String::new(),
        state: Vec::new(),
        call_dims: Vec::new(),
        reading_cache: false,
    };
    lw.check_header(&f.sig);
    let params = lw.params(&f.sig);
    let bindable = lw.check_bindable(&params, f.sig.span());
    let declared = lw.declared_outputs(&f.sig, &bindable);
    let outputs = lw.body(&f.block, &declared.outputs);
    lw.check_caches_written();
    if !lw.diags.is_empty() {
        return Err(lw.diags);
    }
    let outs_sig = outputs
        .iter()
        .map(|o| (lw.nodes[o.idx()].dtype, lw.nodes[o.idx()].shape.clone()))
        .collect();
    let graph = Graph {
        name: f.sig.ident.to_string(),
        params: params.iter().map(|p| p.0.clone()).collect(),
        nodes: lw.nodes,
        outputs,
        dyn_dims: lw.dyn_dims,
        static_dims: opts.dims.clone(),
        state: lw.state.iter().map(|s| s.0).collect(),
    };
    let tuple_return = declared.tuple_return;
    let sig = Signature {
        params,
        outputs: outs_sig,
        tuple_return,
        state: graph.state.clone(),
        call_dims: lw.call_dims.iter().map(|d| d.0.clone()).collect(),
    };
    Ok(Lowered { graph, sig, options: opts })
}

/// The outputs a graph's signature declares.
struct Declared {
    /// Each well-formed output type with its span (outputs with underivable dims are left out).
    outputs: Vec<(DType, Shape, Span)>,
    /// Whether the return type is a tuple (even of one).
    tuple_return: bool,
}

impl Lower<'_> {
    /// Reject what a graph's header cannot be: `async` or generic.
    fn check_header(&mut self, sig: &syn::Signature) {
        if let Some(a) = &sig.asyncness {
            self.diags.push(Diag::new(a.span(), "a fused graph cannot be `async`"));
        }
        if !sig.generics.params.is_empty() {
            self.diags.push(Diag::new(
                sig.generics.span(),
                "a fused graph cannot be generic; dynamic dims are free names in shapes",
            ));
        }
    }

    /// Bind each parameter to a `Param` node (or poison it); returns the well-typed ones.
    /// Tensors come first, then caches (`Cache<..>`, state the graph writes in place), then
    /// the dims the caller gives (`P: usize`), in the order the generated entry points take.
    fn params(&mut self, sig: &syn::Signature) -> Vec<(String, DType, Shape)> {
        let mut params = Vec::new();
        let mut names: Vec<String> = Vec::new();
        // 0: tensors so far, 1: caches, 2: caller dims.
        let mut stage = 0;
        for arg in sig.inputs.iter() {
            let syn::FnArg::Typed(pt) = arg else {
                self.diags.push(Diag::new(arg.span(), "a fused graph takes no `self`"));
                continue;
            };
            let Pat::Ident(pi) = &*pt.pat else {
                self.diags.push(Diag::new(pt.pat.span(), "expected a parameter name"));
                continue;
            };
            let name = pi.ident.to_string();
            if names.contains(&name) {
                self.diags.push(
                    Diag::new(pi.ident.span(), format!("duplicate parameter `{name}`"))
                        .help("each parameter needs its own name"),
                );
                continue;
            }
            names.push(name.clone());
            let kind = match type_name(&pt.ty).as_deref() {
                Some("usize") => 2,
                Some("Cache") => 1,
                _ => 0,
            };
            if kind < stage {
                let what = ["a tensor", "a cache"][kind];
                self.diags.push(
                    Diag::new(pt.ty.span(), format!("{what} parameter after {}", ["", "a cache", "a caller dim"][stage]))
                        .help("parameters go in this order: tensors, then caches (`Cache<..>`), then the dims the caller gives (`P: usize`)"),
                );
            }
            stage = stage.max(kind);
            if kind == 2 {
                self.call_dim(&name, pi.ident.span());
                continue;
            }
            if let Some((dtype, shape)) = self.tensor_type(&pt.ty, true) {
                self.cur_name = name.clone();
                let index = params.len();
                let id =
                    self.push(Op::Param { index }, vec![], dtype, shape.clone(), pi.ident.span());
                if kind == 1 {
                    self.state.push((index, pi.ident.span()));
                }
                self.env.insert(name.clone(), Val::T(id));
                params.push((name, dtype, shape));
            } else {
                self.env.insert(name.clone(), Val::Poison);
            }
        }
        params
    }

    /// A dim the caller gives at each call (a `P: usize` parameter): not a static dim, not
    /// an axis of any parameter (those are bound from the shapes).
    fn call_dim(&mut self, name: &str, span: Span) {
        if self.static_dim(name).is_some() || self.dyn_dims.iter().any(|d| d == name) {
            self.diags.push(
                Diag::new(span, format!("`{name}` is already a dim of the parameters' shapes or of `dims(...)`"))
                    .help("a `usize` parameter names a dim the caller gives, such as the position `P` at which a call writes its keys and values; give it a name of its own"),
            );
            return;
        }
        self.dyn_dims.push(name.to_string());
        self.call_dims.push((name.to_string(), span));
    }

    /// Every cache is written by exactly one `cache_write`.
    fn check_caches_written(&mut self) {
        for (index, span) in self.state.clone() {
            let writes = self
                .nodes
                .iter()
                .filter(|n| {
                    matches!(n.op, Op::CacheWrite { .. })
                        && matches!(self.nodes[n.inputs[0].idx()].op, Op::Param { index: i } if i == index)
                })
                .count();
            if writes != 1 {
                let name = self
                    .nodes
                    .iter()
                    .find(|n| n.op == Op::Param { index })
                    .map(|n| n.name.clone())
                    .unwrap_or_default();
                self.diags.push(
                    Diag::new(span, format!("cache `{name}` is written {writes} times: it must be written exactly once"))
                        .help(format!("write the new rows with `let all = cache_write({name}, new, axis, P);` and read `all`")),
                );
            }
        }
    }

    /// The dims bindable at run time (whole axes of parameters); reports parameter dims that are not.
    fn check_bindable(&mut self, params: &[(String, DType, Shape)], sig_span: Span) -> Vec<String> {
        // Dims that are not a whole axis of some parameter cannot be bound at run time.
        let bindable: Vec<String> = params
            .iter()
            .flat_map(|(_, _, s)| s.iter().filter_map(|d| d.as_sym().map(str::to_string)))
            .collect();
        for (name, _, s) in params {
            for d in s {
                for sym in d.symbols() {
                    if !bindable.contains(&sym) {
                        self.diags.push(
                            Diag::new(sig_span, format!("dynamic dim `{sym}` of parameter `{name}` is never a whole axis, so it cannot be bound at run time"))
                                .help(format!("bind it in `dims({sym} = ...)` or give some parameter an axis of exactly `{sym}`")),
                        );
                    }
                }
            }
        }
        bindable
    }

    /// The return type's tensors; each dim must be static or `bindable`.
    fn declared_outputs(&mut self, sig: &syn::Signature, bindable: &[String]) -> Declared {
        let mut declared = Declared { outputs: Vec::new(), tuple_return: false };
        match &sig.output {
            syn::ReturnType::Default => self.diags.push(Diag::new(
                sig.span(),
                "a fused graph must return a tensor or a tuple of tensors",
            )),
            syn::ReturnType::Type(_, ty) => {
                let tys: Vec<&syn::Type> = match &**ty {
                    syn::Type::Tuple(t) => {
                        declared.tuple_return = true;
                        t.elems.iter().collect()
                    }
                    t => vec![t],
                };
                for t in tys {
                    if let Some(out) = self.declared_output(t, bindable) {
                        declared.outputs.push(out);
                    }
                }
            }
        }
        declared
    }

    /// One output type, if well formed and derivable from the inputs (else reported).
    fn declared_output(
        &mut self,
        t: &syn::Type,
        bindable: &[String],
    ) -> Option<(DType, Shape, Span)> {
        let before = self.dyn_dims.clone();
        let (d, s) = self.tensor_type(t, true)?;
        let new: Vec<String> =
            self.dyn_dims.iter().filter(|x| !before.contains(x)).cloned().collect();
        let unbound: Vec<String> =
            s.iter().flat_map(|d| d.symbols()).filter(|x| !bindable.contains(x)).collect();
        self.dyn_dims = before;
        if !unbound.is_empty() || !new.is_empty() {
            let mut u = unbound;
            u.extend(new);
            u.sort();
            u.dedup();
            self.diags.push(
                Diag::new(t.span(), format!("output dim `{}` cannot be derived from the inputs", u.join("`, `")))
                    .help("every dim of an output must be static (in `dims(...)`) or appear as an axis of a parameter"),
            );
            None
        } else {
            Some((d, s, t.span()))
        }
    }

    /// Lower the statements and the tail expression; returns the graph's outputs (empty on error).
    fn body(&mut self, block: &syn::Block, declared: &[(DType, Shape, Span)]) -> Vec<NodeId> {
        let stmts = &block.stmts;
        let (body, tail) = match stmts.last() {
            Some(Stmt::Expr(e, None)) => (&stmts[..stmts.len() - 1], Some(e)),
            _ => (&stmts[..], None),
        };
        for s in body {
            self.stmt(s);
        }
        match tail {
            None => {
                self.diags.push(Diag::new(
                    block.span(),
                    "a fused graph ends with the expression it returns",
                ));
                Vec::new()
            }
            Some(e) => self.returned(e, declared).unwrap_or_default(),
        }
    }

    /// Lower the returned expression to tensors and check them against the signature.
    fn returned(&mut self, e: &Expr, declared: &[(DType, Shape, Span)]) -> Option<Vec<NodeId>> {
        // Named `return`, not `out`: reports show no binding the user did not write.
        self.cur_name = "return".into();
        let ids = match self.expr(e) {
            Some(Val::T(id)) => vec![id],
            Some(Val::Tuple(ids)) => ids,
            Some(Val::Scalar(_)) => {
                self.diags.push(Diag::new(e.span(), "a graph must return tensors, not a scalar"));
                return None;
            }
            Some(Val::Poison) | None => return None,
        };
        let elems: Vec<Span> = match e {
            Expr::Tuple(t) => t.elems.iter().map(|x| x.span()).collect(),
            _ => vec![e.span(); ids.len()],
        };
        if declared.len() == ids.len() {
            for (k, id) in ids.iter().enumerate() {
                self.check_returned(*id, elems[k], &declared[k]);
            }
        } else if self.diags.is_empty() {
            self.diags.push(Diag::new(
                e.span(),
                format!(
                    "the graph returns {} tensors but the signature declares {}",
                    ids.len(),
                    declared.len()
                ),
            ));
        }
        Some(ids)
    }

    /// Report the first of rank, shape and dtype in which returned value `id` (at `at`) differs
    /// from its declared type.
    fn check_returned(&mut self, id: NodeId, at: Span, (d, s, span): &(DType, Shape, Span)) {
        let n = &self.nodes[id.idx()];
        if n.shape.len() != s.len() {
            self.diags.push(
                Diag::new(
                    at,
                    format!(
                        "rank mismatch: the graph returns {}{} but the signature declares {}{}",
                        n.dtype,
                        shape_str(&n.shape),
                        d,
                        shape_str(s)
                    ),
                )
                .help(format!("declared at line {}", span.start().line)),
            );
        } else if n.shape != *s {
            self.diags.push(Diag::new(
                at,
                format!(
                    "shape mismatch: the graph returns {} but the signature declares {}",
                    shape_str(&n.shape),
                    shape_str(s)
                ),
            ));
        } else if n.dtype != *d {
            self.diags.push(
                Diag::new(
                    at,
                    format!(
                        "dtype mismatch: the graph returns {} but the signature declares {d}",
                        n.dtype
                    ),
                )
                .help(format!("insert `cast(x, {d})`")),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn suggestions_catch_typos_not_unrelated_names() {
        let ops = || super::KNOWN_OPS.iter().copied();
        assert_eq!(super::suggest("layer_nrom", ops()), Some("layer_norm"));
        assert_eq!(super::suggest("gleu", ops()), Some("gelu"));
        assert_eq!(super::suggest("sofmax", ops()), Some("softmax"));
        assert_eq!(super::suggest("frobnicate", ops()), None);
        // Short names only match very close ones, and never a one-letter variable.
        assert_eq!(super::suggest("h", ["x", "h2"].into_iter()), None);
    }
}
