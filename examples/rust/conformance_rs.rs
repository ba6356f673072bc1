//! A dependency-free Rust implementation for the conformance harness's subprocess protocol
//! (docs/subprocess-protocol.md): quant.e2m1, window.indices and address.prefill.
//!
//!   conformance_rs components              the components it implements, one per line
//!   conformance_rs run COMPONENT IN OUT    one call: read IN.safetensors, write OUT.safetensors
//!   conformance_rs serve                   batch mode: "run COMPONENT IN OUT" lines on stdin; answers
//!                                          "ok", "error <message>" or "unsupported <reason>"
//!
//! Everything it needs comes from `conformance list --components --json` (names, dtypes, shapes,
//! param types) and the request files themselves: params arrive as tensors `param.<name>` (I64,
//! F64, BOOL, or U8 UTF-8 bytes for strings). It declines window.indices in the harness's "chunk"
//! mode per case, to show the per-case `unsupported` answer.
//!
//! Build: rustc -O -o build/conformance_rs conformance_rs.rs   (see Makefile)

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, Write};

// --- a minimal safetensors reader and writer -------------------------------------------------

struct Tensor {
    dtype: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

type Tensors = BTreeMap<String, Tensor>;

enum Json {
    Str(String),
    Num(f64),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
    Other,
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && (self.s[self.i] as char).is_whitespace() {
            self.i += 1;
        }
    }
    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.s.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        return Ok(Json::Obj(items));
                    }
                    let key = match self.value()? {
                        Json::Str(k) => k,
                        _ => return Err("object key is not a string".into()),
                    };
                    self.ws();
                    self.i += 1; // ':'
                    items.push((key, self.value()?));
                    self.ws();
                    if self.s.get(self.i) == Some(&b',') {
                        self.i += 1;
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.s.get(self.i) == Some(&b']') {
                        self.i += 1;
                        return Ok(Json::Arr(items));
                    }
                    items.push(self.value()?);
                    self.ws();
                    if self.s.get(self.i) == Some(&b',') {
                        self.i += 1;
                    }
                }
            }
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                while self.s[self.i] != b'"' {
                    if self.s[self.i] == b'\\' {
                        self.i += 1;
                    }
                    out.push(self.s[self.i] as char);
                    self.i += 1;
                }
                self.i += 1;
                Ok(Json::Str(out))
            }
            Some(_) => {
                let start = self.i;
                while self.i < self.s.len() && !b",]} \n".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                Ok(text.parse::<f64>().map(Json::Num).unwrap_or(Json::Other))
            }
            None => Err("unexpected end of header".into()),
        }
    }
}

fn read_safetensors(path: &str) -> Result<Tensors, String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = Parser { s: &bytes[8..8 + n], i: 0 }.value()?;
    let data = &bytes[8 + n..];
    let mut out = Tensors::new();
    if let Json::Obj(items) = header {
        for (name, info) in items {
            if name == "__metadata__" {
                continue;
            }
            let (mut dtype, mut shape, mut offsets) = (String::new(), Vec::new(), (0usize, 0usize));
            if let Json::Obj(fields) = info {
                for (key, value) in fields {
                    match (key.as_str(), value) {
                        ("dtype", Json::Str(d)) => dtype = d,
                        ("shape", Json::Arr(dims)) => {
                            shape = dims.iter().map(|d| if let Json::Num(v) = d { *v as usize } else { 0 }).collect()
                        }
                        ("data_offsets", Json::Arr(o)) => {
                            if let (Json::Num(a), Json::Num(b)) = (&o[0], &o[1]) {
                                offsets = (*a as usize, *b as usize);
                            }
                        }
                        _ => {}
                    }
                }
            }
            out.insert(name, Tensor { dtype, shape, data: data[offsets.0..offsets.1].to_vec() });
        }
    }
    Ok(out)
}

fn write_safetensors(path: &str, tensors: &Tensors) -> Result<(), String> {
    let (mut header, mut offset) = (String::from("{"), 0usize);
    for (i, (name, t)) in tensors.iter().enumerate() {
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        header += &format!(
            "{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            if i > 0 { "," } else { "" },
            name,
            t.dtype,
            shape.join(","),
            offset,
            offset + t.data.len()
        );
        offset += t.data.len();
    }
    header += "}";
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for t in tensors.values() {
        bytes.extend_from_slice(&t.data);
    }
    fs::write(path, bytes).map_err(|e| format!("cannot write {path}: {e}"))
}

fn input<'a>(tensors: &'a Tensors, name: &str, dtype: &str) -> Result<&'a Tensor, String> {
    let t = tensors.get(name).ok_or(format!("input '{name}' missing"))?;
    if t.dtype != dtype {
        return Err(format!("input '{name}' is {}, expected {dtype}", t.dtype));
    }
    Ok(t)
}

fn param_i64(tensors: &Tensors, name: &str) -> Option<i64> {
    let t = tensors.get(&format!("param.{name}"))?;
    (t.dtype == "I64").then(|| i64::from_le_bytes(t.data[..8].try_into().unwrap()))
}

fn param_str(tensors: &Tensors, name: &str) -> Option<String> {
    let t = tensors.get(&format!("param.{name}"))?;
    (t.dtype == "U8").then(|| String::from_utf8_lossy(&t.data).into_owned())
}

// --- the components -------------------------------------------------------------------------

enum Outcome {
    Done(Tensors),
    Unsupported(String),
}

const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The e2m1 code of v: the nearest grid value, ties to the even code; bit 3 carries the sign.
fn e2m1_code(v: f32) -> u8 {
    let m = v.abs().min(6.0);
    let mut best = 0usize;
    for i in 1..8 {
        let (d, e) = ((m - E2M1[i]).abs(), (m - E2M1[best]).abs());
        if d < e || (d == e && i % 2 == 0) {
            best = i;
        }
    }
    best as u8 | if v.is_sign_negative() { 8 } else { 0 }
}

fn quant_e2m1(inputs: &Tensors) -> Result<Outcome, String> {
    let v = input(inputs, "v", "F32")?;
    let (mut codes, mut y) = (Vec::new(), Vec::new());
    for chunk in v.data.chunks(4) {
        let code = e2m1_code(f32::from_le_bytes(chunk.try_into().unwrap()));
        let value = if code & 8 != 0 { -E2M1[(code & 7) as usize] } else { E2M1[(code & 7) as usize] };
        codes.push(code);
        y.extend_from_slice(&value.to_le_bytes());
    }
    let mut out = Tensors::new();
    out.insert("codes".into(), Tensor { dtype: "U8".into(), shape: v.shape.clone(), data: codes });
    out.insert("y".into(), Tensor { dtype: "F32".into(), shape: v.shape.clone(), data: y });
    Ok(Outcome::Done(out))
}

fn ids_tensor(rows: usize, width: usize, ids: Vec<i32>) -> Tensors {
    let data = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = Tensors::new();
    out.insert("ids".into(), Tensor { dtype: "I32".into(), shape: vec![rows, width], data });
    out
}

fn window_indices(inputs: &Tensors) -> Result<Outcome, String> {
    let mode = param_str(inputs, "mode").ok_or("param.mode missing")?;
    let win = param_i64(inputs, "win").ok_or("param.win missing")?;
    match mode.as_str() {
        "prefill" => {
            let s = param_i64(inputs, "seqlen").ok_or("param.seqlen missing")?;
            let width = s.min(win);
            let mut ids = Vec::new();
            for t in 0..s {
                for j in 0..width {
                    let id = (t - win + 1).max(0) + j;
                    ids.push(if id > t { -1 } else { id as i32 });
                }
            }
            Ok(Outcome::Done(ids_tensor(s as usize, width as usize, ids)))
        }
        "decode" => {
            let start = param_i64(inputs, "start").ok_or("param.start missing")?;
            let oldest = start % win + 1;
            let ids = (0..win).map(|j| (oldest + j) % win).map(|id| if id > start { -1 } else { id as i32 }).collect();
            Ok(Outcome::Done(ids_tensor(1, win as usize, ids)))
        }
        other => Ok(Outcome::Unsupported(format!("window.indices mode {other:?} (the harness's chunk generalisation) is not implemented"))),
    }
}

fn address_prefill(inputs: &Tensors) -> Result<Outcome, String> {
    let ids = input(inputs, "ids", "I32")?;
    let base = param_i64(inputs, "base").ok_or("param.base missing")? as i32;
    let data = ids
        .data
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .flat_map(|id| (if id >= 0 { id + base } else { -1 }).to_le_bytes())
        .collect();
    let mut out = Tensors::new();
    out.insert("ids".into(), Tensor { dtype: "I32".into(), shape: ids.shape.clone(), data });
    Ok(Outcome::Done(out))
}

const COMPONENTS: [&str; 3] = ["quant.e2m1", "window.indices", "address.prefill"];

fn call(component: &str, input_path: &str, output_path: &str) -> Result<Outcome, String> {
    let inputs = read_safetensors(input_path)?;
    let outcome = match component {
        "quant.e2m1" => quant_e2m1(&inputs)?,
        "window.indices" => window_indices(&inputs)?,
        "address.prefill" => address_prefill(&inputs)?,
        other => return Err(format!("component {other} is not implemented")),
    };
    if let Outcome::Done(outputs) = &outcome {
        write_safetensors(output_path, outputs)?;
    }
    Ok(outcome)
}

fn answer(result: Result<Outcome, String>) -> String {
    match result {
        Ok(Outcome::Done(_)) => "ok".into(),
        Ok(Outcome::Unsupported(reason)) => format!("unsupported {reason}"),
        Err(message) => format!("error {}", message.replace('\n', " ")),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("components") => COMPONENTS.iter().for_each(|c| println!("{c}")),
        Some("run") if args.len() == 5 => match call(&args[2], &args[3], &args[4]) {
            Ok(Outcome::Done(_)) => {}
            Ok(Outcome::Unsupported(reason)) => println!("unsupported {reason}"),
            Err(message) => {
                eprintln!("{message}");
                std::process::exit(1);
            }
        },
        Some("serve") => {
            let stdout = io::stdout();
            for line in io::stdin().lock().lines() {
                let line = line.unwrap_or_default();
                let words: Vec<&str> = line.split_whitespace().collect();
                let reply = match words.as_slice() {
                    ["run", component, input_path, output_path] => answer(call(component, input_path, output_path)),
                    _ => format!("error cannot parse request {line:?}"),
                };
                let mut out = stdout.lock();
                writeln!(out, "{reply}").and_then(|_| out.flush()).ok();
            }
        }
        _ => {
            eprintln!("usage: conformance_rs components | run COMPONENT IN OUT | serve");
            std::process::exit(2);
        }
    }
}
