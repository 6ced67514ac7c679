//! build.rs helper of autofusion: finds the `#[fused_graph]` functions in the listed files,
//! plans and generates their kernels, compiles them with `cc`, and tells cargo to link them.
//!
//! ```no_run
//! // build.rs
//! fn main() {
//!     autofusion_build::Builder::new().file("src/layers.rs").compile("layers");
//! }
//! ```
//!
//! Output goes to `$OUT_DIR/autofusion/<graph>/`: `fused.c`, `unfused.c`, `plan.json`,
//! `report.md`, `before.dot` and `after.dot` (and `.svg` of both when Graphviz's `dot` is
//! installed); files are rewritten only when their content
//! changes, so a no-op build recompiles nothing.
//!
//! | env var | effect |
//! |---|---|
//! | `AUTOFUSION_VERBOSE=1` | print the plan summary of every graph as cargo warnings |
//! | `AUTOFUSION_PROFILE=<file.json \| host \| ascend910b>` | plan with a pinned profile instead of the host calibration (cached in `<target dir>/autofusion/host-profile.json`) |

#![deny(missing_docs)]

use autofusion_compiler::{env_var, report, target::Target, Unit, Variant};

mod calibrate;
pub mod jit;
pub use autofusion_ascend_sys::toolkit;
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
}

/// The build.rs entry point (`cc::Build`-style setters).
pub struct Builder {
    files: Vec<PathBuf>,
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

/// `dot -Tsvg` when Graphviz is installed and the SVG is older than its DOT file.
fn render_svg(dot: &Path, svg: &Path) {
    let newer = |a: &Path, b: &Path| match (
        a.metadata().and_then(|m| m.modified()),
        b.metadata().and_then(|m| m.modified()),
    ) {
        (Ok(x), Ok(y)) => x > y,
        _ => true,
    };
    if newer(dot, svg) {
        let _ = std::process::Command::new("dot").arg("-Tsvg").arg(dot).arg("-o").arg(svg).output();
    }
}

impl Builder {
    /// A builder with no files.
    pub fn new() -> Builder {
        Builder { files: Vec::new(), options: Options::default(), hook: None }
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
        println!("cargo:rerun-if-env-changed=AUTOFUSION_VERBOSE");
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
        let toolkit = if ascend {
            Some(toolkit::Toolkit::find().map_err(|e| Error { rendered: format!("error: {e}") })?)
        } else {
            None
        };
        let mut graphs: Vec<GraphOutput> = Vec::new();
        let mut errors = String::new();
        let mut asc_files: Vec<(PathBuf, bool)> = Vec::new();
        let mut c_files: Vec<(PathBuf, bool)> = Vec::new();
        let mut seen: Vec<(String, String)> = Vec::new();
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
                    errors += &autofusion_compiler::diag::Diags::from(e).render(&shown, &src);
                    continue;
                }
            };
            let found = autofusion_compiler::find_graphs(&parsed.items);
            if found.is_empty() {
                println!("cargo:warning=autofusion: no #[fused_graph] function in {shown}");
            }
            for (f, attr) in found {
                let unit = match Unit::parse(attr, f) {
                    Ok(u) => u,
                    Err(d) => {
                        errors += &d.render(&shown, &src);
                        continue;
                    }
                };
                let name = unit.name().to_string();
                if let Some((_, other)) = seen.iter().find(|(n, _)| *n == name) {
                    let line = f.sig.ident.span().start().line;
                    errors += &format!(
                        "error: two fused graphs are named `{name}` ({other} and {shown}:{line})\n  = help: graph names key the build output; rename one\n\n"
                    );
                    continue;
                }
                seen.push((name.clone(), format!("{shown}:{}", f.sig.ident.span().start().line)));
                let dir = root.join(&name);
                std::fs::create_dir_all(&dir).map_err(|e| Error {
                    rendered: format!("error: cannot create {}: {e}", dir.display()),
                })?;
                let io = |e: std::io::Error| Error {
                    rendered: format!("error: cannot write into {}: {e}", dir.display()),
                };
                let fused = unit.variant(Variant::Fused, &target);
                let unfused = unit.variant(Variant::Unfused, &target);
                let debug = unit.lowered.options.debug;
                let mut files = Vec::new();
                for b in [&fused, &unfused] {
                    let p = dir.join(format!("{}.c", b.variant.name()));
                    write_if_changed(&p, &b.c.code).map_err(io)?;
                    files.push(p.display().to_string());
                    c_files.push((p, debug));
                }
                if toolkit.is_some() {
                    let ascend_target = Target::ascend910b();
                    for v in [Variant::Fused, Variant::Unfused] {
                        match unit.variant_ascend(v, &ascend_target) {
                            Ok((_, src)) => {
                                let p = dir.join(format!("{}.asc", v.name()));
                                write_if_changed(&p, &src.code).map_err(io)?;
                                asc_files.push((p, debug));
                            }
                            Err(e) => {
                                let line = f.sig.ident.span().start().line;
                                errors += &format!("error: graph `{name}` ({shown}:{line}): no Ascend C for its {} variant: {e}\n  = help: build without the `ascend` feature, or restrict the graph's rules (`rules = [...]`) to groups the Ascend generator supports\n\n", v.name());
                            }
                        }
                    }
                }
                let summary = report::summary(&unit.graph, &fused.plan, &files[..1]);
                write_if_changed(
                    &dir.join("plan.json"),
                    &report::plan_json(&unit.graph, &fused.plan),
                )
                .map_err(io)?;
                write_if_changed(
                    &dir.join("report.md"),
                    &report::report_md(&unit.graph, &fused.plan, &summary),
                )
                .map_err(io)?;
                write_if_changed(&dir.join("before.dot"), &report::dot(&unit.graph, None))
                    .map_err(io)?;
                write_if_changed(
                    &dir.join("after.dot"),
                    &report::dot(&unit.graph, Some(&fused.plan)),
                )
                .map_err(io)?;
                for name in ["before", "after"] {
                    render_svg(&dir.join(format!("{name}.dot")), &dir.join(format!("{name}.svg")));
                }
                if verbose {
                    for l in &summary {
                        println!("cargo:warning={l}");
                    }
                }
                println!("cargo:rustc-env={}={}", env_var(&name), unit.hash);
                if toolkit.is_some() {
                    println!("cargo:rustc-env={}_ASCEND={}", env_var(&name), unit.hash);
                }
                graphs.push(GraphOutput { name, hash: unit.hash.clone(), dir, summary });
            }
        }
        if !errors.is_empty() {
            return Err(Error { rendered: errors.trim_end().to_string() });
        }
        for debug in [false, true] {
            let srcs: Vec<&PathBuf> =
                c_files.iter().filter(|(_, d)| *d == debug).map(|(p, _)| p).collect();
            if srcs.is_empty() {
                continue;
            }
            let mut b = cc::Build::new();
            b.files(srcs).include(&include).warnings(false);
            for f in autofusion_compiler::codegen::c::CFLAGS {
                b.flag_if_supported(f);
            }
            if self.options.out_dir.is_some() {
                b.out_dir(&out_dir); // outside a build script cc has no OUT_DIR of its own
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
            b.try_compile(&name).map_err(|e| Error {
                rendered: format!("error: compiling the generated kernels failed: {e}"),
            })?;
        }
        if let Some(tk) = &toolkit {
            self.compile_ascend(tk, lib, &out_dir, &include, &asc_files)?;
        }
        Ok(Output { graphs })
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
            let srcs: Vec<&PathBuf> =
                files.iter().filter(|(_, d)| *d == debug).map(|(p, _)| p).collect();
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
            b.files(srcs);
            if self.options.out_dir.is_some() {
                b.out_dir(out_dir);
            }
            let objects = b.try_compile_intermediates().map_err(|e| fail(e.to_string()))?;
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
