//! build.rs helper of autofusion: finds the `#[fused_graph]` functions in the listed files,
//! plans and generates their kernels, compiles them with `cc`, and tells cargo to link them.
//!
//! ```no_run
//! // build.rs: fn main() { ... }
//! autofusion_build::Builder::new().file("src/layers.rs").compile("layers");
//! ```
//!
//! Output goes to `$OUT_DIR/autofusion/<graph>/`: `fused.c`, `unfused.c`, `plan.json`,
//! `report.md`, `before.dot` and `after.dot` (and `.svg` of both when Graphviz's `dot` is
//! installed); files are rewritten only when their content changes, and each source's object is
//! cached under a key of its text, the headers and the compiler command (`fused-<key>.o`), so
//! a build that leaves a graph's code alone compiles nothing of it.
//!
//! | env var | effect |
//! |---|---|
//! | `AUTOFUSION_VERBOSE=1` | print the plan summary of every graph as cargo warnings when the build script runs (setting it does not rerun it: `report.md` always has the summary) |
//! | `AUTOFUSION_PROFILE=<file.json \| host \| ascend910b>` | plan with a pinned profile instead of the host calibration (cached in `<target dir>/autofusion/host-profile.json`) |

#![deny(missing_docs)]

use autofusion_compiler::codegen::ascend::Ascend;
use autofusion_compiler::codegen::host::Host;
use autofusion_compiler::codegen::{Backend, Toolchain};
use autofusion_compiler::{env_var, report, target::Target, Unit, Variant};

mod calibrate;
pub mod jit;
mod objects;
mod onnx;
pub use autofusion_ascend_sys::toolkit;

/// The Rust module `Builder::onnx` writes for the model at `path` named `name` (default
/// options, no Ascend entries; inline weights go to `dir`): for the generated-source dump of
/// `examples/dump_generated.rs`, not a stable API.
#[doc(hidden)]
pub fn onnx_glue_for_dump(path: &Path, name: &str, dir: &Path) -> Result<String, String> {
    let m = onnx::OnnxModel {
        path: path.to_path_buf(),
        name: name.into(),
        options: autofusion_compiler::Options::default(),
    };
    let im = onnx::import(&m)?;
    onnx::glue(&im, &m, dir, false)
}
use std::fmt;
use std::path::{Path, PathBuf};

/// Options of a build.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Options {
    /// Print plan summaries as cargo warnings (default: `AUTOFUSION_VERBOSE=1`).
    pub verbose: Option<bool>,
    /// Where to write generated files (default: `$OUT_DIR`).
    pub out_dir: Option<PathBuf>,
    /// Plan for this profile instead of the calibrated host (`host`, `ascend910b`).
    pub target: Option<String>,
    /// Also generate Ascend C, compile it with the CANN toolkit and link it (default: when
    /// the package being built has its `ascend` feature on, `CARGO_FEATURE_ASCEND`).
    pub ascend: Option<bool>,
    /// What to do with a graph the front end rejects (default: `FrontEndErrors::Deferred`).
    pub front_end_errors: FrontEndErrors,
}

/// Where the errors of a graph the front end rejects (DSL mistakes, bad options, a file that
/// does not parse) are reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrontEndErrors {
    /// Skip the graph with one `cargo:warning` line and let the build script succeed: the
    /// `#[fused_graph]` macro finds the same errors and rustc reports them spanned on the
    /// user's code, where `cargo check` and editors show them (a build script's failure is a
    /// dump of its output that editors cannot place).
    #[default]
    Deferred,
    /// Fail the build with them, rendered (file:line:col, what, help): for tools and tests that
    /// run the build helper outside cargo.
    Rendered,
}

/// The build.rs entry point (`cc::Build`-style setters).
pub struct Builder {
    files: Vec<PathBuf>,
    onnx: Vec<onnx::OnnxModel>,
    options: Options,
    #[allow(clippy::type_complexity)]
    hook: Option<Box<dyn Fn(&mut cc::Build)>>,
}

/// A build failure, rendered like rustc's errors (file:line:col, what, help).
#[derive(Debug, Clone)]
pub struct Error {
    /// The full rendered message.
    pub rendered: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rendered)
    }
}

impl std::error::Error for Error {}

/// One compiled graph.
#[derive(Debug, Clone)]
pub struct GraphOutput {
    /// The graph's name.
    pub name: String,
    /// Its content hash.
    pub hash: String,
    /// Directory with its generated files.
    pub dir: PathBuf,
    /// The plan summary lines.
    pub summary: Vec<String>,
}

/// What a build produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// Every graph found, in file order.
    pub graphs: Vec<GraphOutput>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

/// Write `path` only if its content differs (keeps mtimes, so cc and cargo skip work).
fn write_if_changed(path: &Path, content: &str) -> std::io::Result<()> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(content) {
        return Ok(());
    }
    std::fs::write(path, content)
}

/// `dot -Tsvg` when the SVG is older than its DOT file; `Err` says why no SVG was made.
fn render_svg(dot: &Path, svg: &Path) -> Result<(), String> {
    let newer = |a: &Path, b: &Path| match (
        a.metadata().and_then(|m| m.modified()),
        b.metadata().and_then(|m| m.modified()),
    ) {
        (Ok(x), Ok(y)) => x > y,
        _ => true,
    };
    if !newer(dot, svg) {
        return Ok(());
    }
    match std::process::Command::new("dot").arg("-Tsvg").arg(dot).arg("-o").arg(svg).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("`dot -Tsvg` failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("Graphviz's `dot` is not installed (e.g. `apt install graphviz`); the .dot files are there".into())
        }
        Err(e) => Err(format!("cannot run `dot`: {e}")),
    }
}

impl Builder {
    /// A builder with no files.
    pub fn new() -> Builder {
        Builder { files: Vec::new(), onnx: Vec::new(), options: Options::default(), hook: None }
    }
    /// Add an ONNX model as the fused module `name`, planned at the default options
    /// (opt_level 2, every default rule). The build writes `$OUT_DIR/autofusion/<name>.rs`,
    /// which the crate includes:
    ///
    /// ```ignore
    /// include!(concat!(env!("OUT_DIR"), "/autofusion/encoder.rs"));
    /// let y = encoder::run(&x)?; // the model's inputs by name, its weights read from the file
    /// ```
    ///
    /// The module has `run`, `unfused`, `reference` and `run_on(device, ..)` taking the model's
    /// inputs in its order, and `weights()` (read from the model file once, memory-mapped).
    pub fn onnx(&mut self, model: impl AsRef<Path>, name: &str) -> &mut Builder {
        self.onnx_with(model, name, autofusion_compiler::Options::default())
    }
    /// `onnx` with planning options (opt level, rules, dynamic-dim hints).
    pub fn onnx_with(
        &mut self,
        model: impl AsRef<Path>,
        name: &str,
        options: autofusion_compiler::Options,
    ) -> &mut Builder {
        let path = model.as_ref().to_path_buf();
        self.onnx.push(onnx::OnnxModel { path, name: name.to_string(), options });
        self
    }
    /// Add a Rust source file holding `#[fused_graph]` functions.
    pub fn file(&mut self, p: impl AsRef<Path>) -> &mut Builder {
        self.files.push(p.as_ref().to_path_buf());
        self
    }
    /// Add several files.
    pub fn files<P: AsRef<Path>>(&mut self, ps: impl IntoIterator<Item = P>) -> &mut Builder {
        for p in ps {
            self.file(p);
        }
        self
    }
    /// Print plan summaries as cargo warnings.
    pub fn verbose(&mut self, v: bool) -> &mut Builder {
        self.options.verbose = Some(v);
        self
    }
    /// Plan for a named profile (`host`, `ascend910b`) instead of the calibrated host.
    pub fn target(&mut self, name: &str) -> &mut Builder {
        self.options.target = Some(name.to_string());
        self
    }
    /// Generate, compile and link Ascend C kernels too (see `Options::ascend`).
    pub fn ascend(&mut self, on: bool) -> &mut Builder {
        self.options.ascend = Some(on);
        self
    }
    /// Where front-end errors are reported (see `FrontEndErrors`).
    pub fn front_end_errors(&mut self, e: FrontEndErrors) -> &mut Builder {
        self.options.front_end_errors = e;
        self
    }
    /// Write generated files under `dir` instead of `$OUT_DIR`.
    pub fn out_dir(&mut self, dir: impl AsRef<Path>) -> &mut Builder {
        self.options.out_dir = Some(dir.as_ref().to_path_buf());
        self
    }
    /// Replace all options.
    pub fn options(&mut self, o: Options) -> &mut Builder {
        self.options = o;
        self
    }
    /// Adjust the `cc::Build` before it compiles the kernels.
    pub fn cc_hook(&mut self, f: impl Fn(&mut cc::Build) + 'static) -> &mut Builder {
        self.hook = Some(Box::new(f));
        self
    }

    /// Build, or print the rendered error and exit with status 1 (for build.rs).
    pub fn compile(&mut self, lib: &str) -> Output {
        match self.try_compile(lib) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }

    /// Build and return the structured result (for tools and tests).
    pub fn try_compile(&mut self, lib: &str) -> Result<Output, Error> {
        let ctx = self.context()?;
        let (units, mut errors) = self.collect_units();
        let mut graphs = Vec::new();
        let mut sources: Vec<(Toolchain, PathBuf, bool)> = Vec::new();
        for (unit, at) in &units {
            match emit_graph(&ctx, unit, at, &mut sources) {
                Ok(g) => graphs.push(g),
                Err(e) => errors += &e,
            }
        }
        for m in &self.onnx {
            match self.emit_onnx(&ctx, m, &units, &mut sources) {
                Ok(g) => graphs.push(g),
                Err(e) => errors += &e,
            }
        }
        if !errors.is_empty() {
            return Err(Error { rendered: errors.trim_end().to_string() });
        }
        let of = |tc: fn(&Toolchain) -> bool| -> Vec<(PathBuf, bool)> {
            sources.iter().filter(|(t, _, _)| tc(t)).map(|(_, p, d)| (p.clone(), *d)).collect()
        };
        self.compile_host(lib, &ctx, &of(|t| matches!(t, Toolchain::Cc { .. })))?;
        if let Some(tk) = &ctx.toolkit {
            self.compile_ascend(
                tk,
                lib,
                &ctx.out_dir,
                &ctx.include,
                &of(|t| *t == Toolchain::Bisheng),
            )?;
        }
        Ok(Output { graphs })
    }

    /// One `Builder::onnx` model: imported, its kernels generated like a graph's, and its Rust
    /// module written next to them.
    fn emit_onnx(
        &self,
        ctx: &Context,
        m: &onnx::OnnxModel,
        units: &[(Unit, String)],
        sources: &mut Vec<(Toolchain, PathBuf, bool)>,
    ) -> Result<GraphOutput, String> {
        if let Some((_, at)) = units.iter().find(|(u, _)| u.name() == m.name) {
            return Err(format!(
                "error: the ONNX model `{}` ({}) has the name of the fused graph at {at}\n  = help: graph names key the build output; pick another name\n\n",
                m.name,
                m.path.display()
            ));
        }
        let im = onnx::import(m)?;
        let at = m.path.display().to_string();
        let out = emit_graph(ctx, &im.unit, &at, sources)?;
        let glue = onnx::glue(&im, m, &out.dir, ctx.toolkit.is_some())?;
        let path = ctx.root.join(format!("{}.rs", m.name));
        write_if_changed(&path, &glue)
            .map_err(|e| format!("error: cannot write {}: {e}\n\n", path.display()))?;
        Ok(out)
    }

    /// Where output goes, the kernel headers written there, the profile to plan with and the
    /// backends to generate for (the host always; Ascend when the package asks for it).
    fn context(&self) -> Result<Context, Error> {
        // No rerun-if-env-changed for AUTOFUSION_VERBOSE: printing must not invalidate the
        // build (report.md always holds the summary); it shows when the script next runs.
        let verbose = self
            .options
            .verbose
            .unwrap_or_else(|| std::env::var("AUTOFUSION_VERBOSE").is_ok_and(|v| v == "1"));
        let out_dir = match &self.options.out_dir {
            Some(d) => d.clone(),
            None => PathBuf::from(std::env::var("OUT_DIR").map_err(|_| Error {
                rendered: "error: OUT_DIR is not set: autofusion_build runs from a build script (or set Options::out_dir)".into(),
            })?),
        };
        let root = out_dir.join("autofusion");
        let include = root.join("include");
        autofusion_compiler::codegen::write_headers(&include).map_err(|e| Error {
            rendered: format!(
                "error: cannot write the kernel headers into {}: {e}",
                include.display()
            ),
        })?;
        let (target, provenance) = match &self.options.target {
            Some(name) => match Target::named(name) {
                Some(t) => (t, format!("profile `{name}` (Builder::target)")),
                None => return Err(Error { rendered: format!("error: unknown target profile `{name}`\n  = help: known profiles: host, ascend910b") }),
            },
            None => calibrate::profile(&out_dir).map_err(|e| Error { rendered: format!("error: {e}") })?,
        };
        if verbose {
            println!("cargo:warning=[INFO] Planning for {provenance}.");
        }
        let ascend = match self.options.ascend {
            Some(a) => a,
            None => std::env::var_os("CARGO_FEATURE_ASCEND").is_some(),
        };
        let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Host::new(target))];
        let toolkit = if ascend {
            backends.push(Box::new(Ascend::default()));
            Some(toolkit::Toolkit::find().map_err(|e| Error { rendered: format!("error: {e}") })?)
        } else {
            None
        };
        Ok(Context { verbose, out_dir, root, include, backends, toolkit })
    }

    /// Every `#[fused_graph]` of the listed files as a unit with where it was found, and the
    /// rendered errors of those that could not be read or (with `FrontEndErrors::Rendered`)
    /// parsed or checked.
    fn collect_units(&self) -> (Vec<(Unit, String)>, String) {
        let mut units: Vec<(Unit, String)> = Vec::new();
        let mut errors = String::new();
        for file in &self.files {
            println!("cargo:rerun-if-changed={}", file.display());
            let shown = file.display().to_string();
            let src = match std::fs::read_to_string(file) {
                Ok(s) => s,
                Err(e) => {
                    errors += &format!("error: cannot read `{shown}`: {e}\n  = help: paths in Builder::file are relative to the package root\n\n");
                    continue;
                }
            };
            let parsed: syn::File = match syn::parse_file(&src) {
                Ok(f) => f,
                Err(e) => {
                    let rendered = autofusion_compiler::diag::Diags::from(e).render(&shown, &src);
                    self.front_end_error(
                        &format!("`{shown}` does not parse"),
                        rendered,
                        &mut errors,
                    );
                    continue;
                }
            };
            let found = autofusion_compiler::find_graphs(&parsed.items);
            if found.is_empty() {
                println!("cargo:warning=autofusion: no #[fused_graph] function in {shown}");
            }
            for (f, attr) in found {
                let at = format!("{shown}:{}", f.sig.ident.span().start().line);
                match Unit::parse(attr, f) {
                    Ok(u) => {
                        if let Some((_, other)) = units.iter().find(|(v, _)| v.name() == u.name()) {
                            errors += &format!(
                                "error: two fused graphs are named `{}` ({other} and {at})\n  = help: graph names key the build output; rename one\n\n",
                                u.name()
                            );
                        } else {
                            units.push((u, at));
                        }
                    }
                    Err(d) => {
                        let what = format!("graph `{}` ({at}) has errors", f.sig.ident);
                        self.front_end_error(&what, d.render(&shown, &src), &mut errors);
                    }
                }
            }
        }
        (units, errors)
    }

    /// Report a front-end error as `Options::front_end_errors` says: one warning (rustc shows
    /// the errors through the macro) or the rendered error added to `errors`.
    fn front_end_error(&self, what: &str, rendered: String, errors: &mut String) {
        match self.options.front_end_errors {
            FrontEndErrors::Deferred => println!(
                "cargo:warning=autofusion: {what}; not built (rustc reports the errors at the code)"
            ),
            FrontEndErrors::Rendered => *errors += &rendered,
        }
    }

    /// Compile the host sources into `lib` (and `lib_debug` for graphs with `debug = true`).
    fn compile_host(
        &self,
        lib: &str,
        ctx: &Context,
        files: &[(PathBuf, bool)],
    ) -> Result<(), Error> {
        for debug in [false, true] {
            let srcs: Vec<&Path> =
                files.iter().filter(|(_, d)| *d == debug).map(|(p, _)| p.as_path()).collect();
            if srcs.is_empty() {
                continue;
            }
            let mut b = cc::Build::new();
            b.include(&ctx.include).warnings(false);
            for f in autofusion_compiler::codegen::host::CFLAGS {
                b.flag_if_supported(f);
            }
            if self.options.out_dir.is_some() {
                b.out_dir(&ctx.out_dir); // outside a build script cc has no OUT_DIR of its own
            }
            if debug {
                b.opt_level(0).debug(true);
            } else {
                b.opt_level(3);
            }
            if let Some(h) = &self.hook {
                h(&mut b);
            }
            let name = if debug { format!("{lib}_debug") } else { lib.to_string() };
            let fail = |e: String| Error {
                rendered: format!("error: compiling the generated kernels failed: {e}"),
            };
            let scratch = ctx.root.join("cc-scratch");
            let objects =
                objects::cached_objects(&b, &srcs, &headers_text(), &scratch).map_err(fail)?;
            let archive = b.try_create_archive(&name, &objects).map_err(|e| fail(e.to_string()))?;
            cc::try_emit_link_directives(&b, &archive).map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    }

    /// `cc` drives bisheng to compile every `.asc`, bisheng makes the static library (doc
    /// §5.5: the library must come from bisheng so the device code stays registered), and
    /// cargo is told to link it with AscendCL and the runtime libraries the toolkit has.
    fn compile_ascend(
        &self,
        tk: &toolkit::Toolkit,
        lib: &str,
        out_dir: &Path,
        include: &Path,
        files: &[(PathBuf, bool)],
    ) -> Result<(), Error> {
        let fail = |e: String| Error {
            rendered: format!("error: compiling the generated Ascend C failed: {e}"),
        };
        for debug in [false, true] {
            let srcs: Vec<&Path> =
                files.iter().filter(|(_, d)| *d == debug).map(|(p, _)| p.as_path()).collect();
            if srcs.is_empty() {
                continue;
            }
            let mut b = cc::Build::new();
            b.compiler(&tk.bisheng)
                .cpp(true)
                .cpp_link_stdlib(None)
                .warnings(false)
                .debug(debug)
                .opt_level(if debug { 0 } else { 2 });
            for f in tk.compile_flags(debug) {
                b.flag(&f);
            }
            b.flag(format!("-I{}", include.display()));
            if self.options.out_dir.is_some() {
                b.out_dir(out_dir);
            }
            let scratch = out_dir.join("autofusion").join("bisheng-scratch");
            let objects =
                objects::cached_objects(&b, &srcs, &headers_text(), &scratch).map_err(fail)?;
            let name = if debug { format!("{lib}_ascend_debug") } else { format!("{lib}_ascend") };
            let a = out_dir.join(format!("lib{name}.a"));
            tk.run(&tk.static_lib_args(&objects, &a)).map_err(fail)?;
            println!("cargo:rustc-link-search=native={}", out_dir.display());
            println!("cargo:rustc-link-lib=static:+whole-archive={name}");
        }
        let lib_dir = tk.lib_dir();
        println!("cargo:rustc-link-search=native={}", lib_dir.display());
        for (l, is_static) in tk.link_libs() {
            println!("cargo:rustc-link-lib={}={l}", if is_static { "static" } else { "dylib" });
        }
        // The package's binaries, tests and examples find the toolkit's libraries at run time
        // without LD_LIBRARY_PATH (set_env.sh sets it on a CANN machine anyway).
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
        Ok(())
    }
}

/// The kernel headers' text (part of every object's cache key: the sources include them).
fn headers_text() -> String {
    autofusion_compiler::codegen::HEADERS
        .iter()
        .map(|(name, text)| format!("{name}\n{text}"))
        .collect()
}

/// What every graph of one build shares.
struct Context {
    verbose: bool,
    out_dir: PathBuf,
    /// `$OUT_DIR/autofusion`: one folder per graph.
    root: PathBuf,
    /// The kernel headers' include root.
    include: PathBuf,
    backends: Vec<Box<dyn Backend>>,
    toolkit: Option<toolkit::Toolkit>,
}

/// Generate one graph for every backend (both variants) into its folder, with its reports,
/// and tell the macro which hash was built; the sources to compile are added to `sources`.
/// An error comes back rendered.
fn emit_graph(
    ctx: &Context,
    unit: &Unit,
    at: &str,
    sources: &mut Vec<(Toolchain, PathBuf, bool)>,
) -> Result<GraphOutput, String> {
    let name = unit.name().to_string();
    let dir = ctx.root.join(&name);
    let io = |e: std::io::Error| format!("error: cannot write into {}: {e}\n\n", dir.display());
    std::fs::create_dir_all(&dir).map_err(io)?;
    let debug = unit.lowered.options.debug;
    let mut host_plan = None;
    let mut files = Vec::new();
    for backend in &ctx.backends {
        for v in [Variant::Fused, Variant::Unfused] {
            let built = unit.build(backend.as_ref(), v).map_err(|e| {
                format!(
                    "error: graph `{name}` ({at}): no {} code for its {} variant: {e}\n  = help: build without that backend, or restrict the graph's rules (`rules = [...]`) to groups it supports\n\n",
                    backend.name(),
                    v.name()
                )
            })?;
            let p = dir.join(format!("{}.{}", v.name(), built.source.extension));
            write_if_changed(&p, &built.source.code).map_err(io)?;
            files.push(p.display().to_string());
            sources.push((backend.toolchain(), p, debug));
            if backend.name() == "host" && v == Variant::Fused {
                host_plan = Some(built.plan);
            }
        }
    }
    let plan = host_plan.expect("the host backend is always built");
    let summary = report::summary(&unit.graph, &plan, &files[..1]);
    write_reports(&dir, unit, &plan, &summary).map_err(io)?;
    if ctx.verbose {
        for l in &summary {
            println!("cargo:warning={l}");
        }
    }
    println!("cargo:rustc-env={}={}", env_var(&name), unit.hash);
    if ctx.toolkit.is_some() {
        println!("cargo:rustc-env={}_ASCEND={}", env_var(&name), unit.hash);
    }
    Ok(GraphOutput { name, hash: unit.hash.clone(), dir, summary })
}

/// `plan.json`, `report.md` and the graph before and after fusion as DOT (and SVG).
fn write_reports(
    dir: &Path,
    unit: &Unit,
    plan: &autofusion_compiler::plan::Plan,
    summary: &[String],
) -> std::io::Result<()> {
    let g = &unit.graph;
    write_if_changed(&dir.join("plan.json"), &report::plan_json(g, plan))?;
    write_if_changed(&dir.join("before.dot"), &report::dot(g, None))?;
    write_if_changed(&dir.join("after.dot"), &report::dot(g, Some(plan)))?;
    let mut why_no_svg = None;
    for name in ["before", "after"] {
        let svg = render_svg(&dir.join(format!("{name}.dot")), &dir.join(format!("{name}.svg")));
        why_no_svg = why_no_svg.or(svg.err());
    }
    let mut md = report::report_md(g, plan, summary);
    if let Some(why) = why_no_svg {
        md += &format!("\nNo SVG of the graphs was made: {why}.\n");
    }
    write_if_changed(&dir.join("report.md"), &md)?;
    Ok(())
}
