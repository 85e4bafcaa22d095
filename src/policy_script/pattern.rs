//! Lua 5.4's pattern functions (`string.find`, `match`, `gmatch`, `gsub`),
//! metered: every step of the matcher is charged to the call's instruction
//! budget, which the Lua hook cannot do inside a C function.
//!
//! ```text
//!   s:find(p) ──> find() ──> do_match ─┬─ one step per pattern item tried ──> Meter::charge
//!                                      └─ budget gone ──> error, counted as the budget
//! ```
//!
//! Lua's own matcher backtracks: with k repetition items (`*`, `+`, `-`)
//! over a subject of n bytes a match can take n^(k+1) steps, seconds for a
//! 4 KiB command line and three items, all of it in one C call that the
//! instruction hook never sees. This is the same algorithm as Lua 5.4's
//! lstrlib.c (the same results, captures, errors and limits: 32 captures,
//! a recursion depth of 200), with a meter; unit tests compare it with
//! Lua's own functions on generated patterns.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use mlua::{Function, Lua, MultiValue, Table, Value, Variadic};

/// Matcher steps charged as one hook tick (`HOOK_EVERY` Lua instructions):
/// a step (compare a byte with a pattern item) is about a tenth of a Lua
/// instruction's cost.
pub const STEPS_PER_TICK: u64 = 10_000;

const MAX_CAPTURES: usize = 32;
const MAX_DEPTH: u32 = 200;
const SPECIALS: &[u8] = b"^$*+?.([%-";

/// The budget shared with the instruction hook: ticks left in the call,
/// and the flag that says the budget (not an error) ended it.
#[derive(Clone)]
pub struct Meter {
    pub ticks_left: Arc<AtomicU32>,
    pub exceeded: Arc<AtomicBool>,
    /// Steps charged in the call that make less than a tick yet.
    pub carry: Arc<AtomicU64>,
    /// The error a call that runs out says.
    pub message: Arc<str>,
}

impl Meter {
    /// Takes `ticks` from the budget; an error when there are not that many.
    fn take(&self, ticks: u64) -> mlua::Result<()> {
        let t = u32::try_from(ticks).unwrap_or(u32::MAX);
        if self.ticks_left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(t)).is_err() {
            self.ticks_left.store(0, Ordering::Relaxed);
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(mlua::Error::RuntimeError(self.message.to_string()));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Cap {
    Unfinished,
    Position,
    Len(usize),
}

struct State<'a> {
    src: &'a [u8],
    pat: &'a [u8],
    depth: u32,
    level: usize,
    capture: [(usize, Cap); MAX_CAPTURES],
    /// Steps not charged yet (charged a tick at a time).
    steps: u64,
    meter: &'a Meter,
}

type R<T> = mlua::Result<T>;

fn err<T>(msg: impl Into<String>) -> R<T> {
    Err(mlua::Error::RuntimeError(msg.into()))
}

/// The C locale's character classes (`%a`, `%d`, ...); another letter
/// matches itself.
fn match_class(c: u8, cl: u8) -> bool {
    let res = match cl.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        b's' => c == b' ' || (b'\t'..=b'\r').contains(&c),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        _ => return cl == c,
    };
    if cl.is_ascii_uppercase() {
        !res
    } else {
        res
    }
}

impl State<'_> {
    /// The pattern's byte at `i`, 0 past its end (C's terminating NUL).
    fn p(&self, i: usize) -> u8 {
        self.pat.get(i).copied().unwrap_or(0)
    }

    fn s(&self, i: usize) -> u8 {
        self.src.get(i).copied().unwrap_or(0)
    }

    fn step(&mut self) -> R<()> {
        self.steps += 1;
        if self.steps >= STEPS_PER_TICK {
            self.steps = 0;
            self.meter.take(1)?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.level = 0;
        self.depth = MAX_DEPTH;
    }

    /// The end of the single-character class at `p`.
    fn class_end(&self, mut p: usize) -> R<usize> {
        let c = self.p(p);
        p += 1;
        match c {
            b'%' => {
                if p >= self.pat.len() {
                    return err("malformed pattern (ends with '%')");
                }
                Ok(p + 1)
            }
            b'[' => {
                if self.p(p) == b'^' {
                    p += 1;
                }
                loop {
                    if p >= self.pat.len() {
                        return err("malformed pattern (missing ']')");
                    }
                    let c = self.p(p);
                    p += 1;
                    if c == b'%' && p < self.pat.len() {
                        p += 1;
                    }
                    if self.p(p) == b']' {
                        break;
                    }
                }
                Ok(p + 1)
            }
            _ => Ok(p),
        }
    }

    /// `[...]` from `p` (its '[') to `ec` (its ']').
    fn bracket(&self, c: u8, mut p: usize, ec: usize) -> bool {
        let mut sig = true;
        if self.p(p + 1) == b'^' {
            sig = false;
            p += 1;
        }
        loop {
            p += 1;
            if p >= ec {
                break;
            }
            if self.p(p) == b'%' {
                p += 1;
                if match_class(c, self.p(p)) {
                    return sig;
                }
            } else if self.p(p + 1) == b'-' && p + 2 < ec {
                p += 2;
                if self.p(p - 2) <= c && c <= self.p(p) {
                    return sig;
                }
            } else if self.p(p) == c {
                return sig;
            }
        }
        !sig
    }

    fn single(&self, s: usize, p: usize, ep: usize) -> bool {
        if s >= self.src.len() {
            return false;
        }
        let c = self.src[s];
        match self.p(p) {
            b'.' => true,
            b'%' => match_class(c, self.p(p + 1)),
            b'[' => self.bracket(c, p, ep - 1),
            pc => pc == c,
        }
    }

    fn balance(&mut self, s: usize, p: usize) -> R<Option<usize>> {
        if p + 1 >= self.pat.len() {
            return err("malformed pattern (missing arguments to '%b')");
        }
        if s >= self.src.len() || self.src[s] != self.p(p) {
            return Ok(None);
        }
        let (b, e) = (self.p(p), self.p(p + 1));
        let mut cont = 1;
        let mut s = s + 1;
        while s < self.src.len() {
            self.step()?;
            let c = self.src[s];
            if c == e {
                cont -= 1;
                if cont == 0 {
                    return Ok(Some(s + 1));
                }
            } else if c == b {
                cont += 1;
            }
            s += 1;
        }
        Ok(None)
    }

    fn max_expand(&mut self, s: usize, p: usize, ep: usize) -> R<Option<usize>> {
        let mut i = 0;
        while self.single(s + i, p, ep) {
            self.step()?;
            i += 1;
        }
        loop {
            if let Some(r) = self.do_match(s + i, ep + 1)? {
                return Ok(Some(r));
            }
            if i == 0 {
                return Ok(None);
            }
            i -= 1;
        }
    }

    fn min_expand(&mut self, mut s: usize, p: usize, ep: usize) -> R<Option<usize>> {
        loop {
            if let Some(r) = self.do_match(s, ep + 1)? {
                return Ok(Some(r));
            }
            if self.single(s, p, ep) {
                s += 1;
            } else {
                return Ok(None);
            }
        }
    }

    fn start_capture(&mut self, s: usize, p: usize, what: Cap) -> R<Option<usize>> {
        if self.level >= MAX_CAPTURES {
            return err("too many captures");
        }
        self.capture[self.level] = (s, what);
        self.level += 1;
        let r = self.do_match(s, p)?;
        if r.is_none() {
            self.level -= 1;
        }
        Ok(r)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> R<Option<usize>> {
        let Some(l) = (0..self.level).rev().find(|&l| self.capture[l].1 == Cap::Unfinished) else {
            return err("invalid pattern capture");
        };
        self.capture[l].1 = Cap::Len(s - self.capture[l].0);
        let r = self.do_match(s, p)?;
        if r.is_none() {
            self.capture[l].1 = Cap::Unfinished;
        }
        Ok(r)
    }

    fn check_capture(&self, c: u8) -> R<usize> {
        let l = c as i32 - b'1' as i32;
        if l < 0 || l as usize >= self.level || self.capture[l as usize].1 == Cap::Unfinished {
            return err(format!("invalid capture index %{}", l + 1));
        }
        Ok(l as usize)
    }

    fn match_capture(&mut self, s: usize, c: u8) -> R<Option<usize>> {
        let l = self.check_capture(c)?;
        let (init, cap) = self.capture[l];
        // A position capture has no text: Lua compares a length that no
        // subject has, so it never matches.
        let Cap::Len(len) = cap else {
            return Ok(None);
        };
        self.steps += len as u64;
        if self.src.len() - s >= len && self.src[init..init + len] == self.src[s..s + len] {
            Ok(Some(s + len))
        } else {
            Ok(None)
        }
    }

    /// Lua's `match`: the end of the match of `pat[p..]` at `s`, if any.
    fn do_match(&mut self, mut s: usize, mut p: usize) -> R<Option<usize>> {
        if self.depth == 0 {
            return err("pattern too complex");
        }
        self.depth -= 1;
        let r = loop {
            self.step()?;
            if p >= self.pat.len() {
                break Some(s);
            }
            match self.p(p) {
                b'(' => {
                    break if self.p(p + 1) == b')' {
                        self.start_capture(s, p + 2, Cap::Position)?
                    } else {
                        self.start_capture(s, p + 1, Cap::Unfinished)?
                    };
                }
                b')' => break self.end_capture(s, p + 1)?,
                b'$' if p + 1 == self.pat.len() => break (s == self.src.len()).then_some(s),
                b'%' if self.p(p + 1) == b'b' => match self.balance(s, p + 2)? {
                    Some(e) => {
                        s = e;
                        p += 4;
                    }
                    None => break None,
                },
                b'%' if self.p(p + 1) == b'f' => {
                    p += 2;
                    if self.p(p) != b'[' {
                        return err("missing '[' after '%f' in pattern");
                    }
                    let ep = self.class_end(p)?;
                    let previous = if s == 0 { 0 } else { self.s(s - 1) };
                    if !self.bracket(previous, p, ep - 1) && self.bracket(self.s(s), p, ep - 1) {
                        p = ep;
                    } else {
                        break None;
                    }
                }
                b'%' if self.p(p + 1).is_ascii_digit() => match self.match_capture(s, self.p(p + 1))? {
                    Some(e) => {
                        s = e;
                        p += 2;
                    }
                    None => break None,
                },
                _ => {
                    let ep = self.class_end(p)?;
                    let suffix = self.p(ep);
                    if !self.single(s, p, ep) {
                        if matches!(suffix, b'*' | b'?' | b'-') {
                            p = ep + 1;
                            continue;
                        }
                        break None;
                    }
                    match suffix {
                        b'?' => match self.do_match(s + 1, ep + 1)? {
                            Some(r) => break Some(r),
                            None => p = ep + 1,
                        },
                        b'+' => break self.max_expand(s + 1, p, ep)?,
                        b'*' => break self.max_expand(s, p, ep)?,
                        b'-' => break self.min_expand(s, p, ep)?,
                        _ => {
                            s += 1;
                            p = ep;
                        }
                    }
                }
            }
        };
        self.depth += 1;
        Ok(r)
    }

    /// Capture `i` (the whole match `s..e` when there are none).
    fn capture_value(&self, lua: &Lua, i: usize, s: usize, e: usize) -> R<Value> {
        if i >= self.level {
            if i != 0 {
                return err(format!("invalid capture index %{}", i + 1));
            }
            return Ok(Value::String(lua.create_string(&self.src[s..e])?));
        }
        let (init, cap) = self.capture[i];
        match cap {
            Cap::Unfinished => err("unfinished capture"),
            Cap::Position => Ok(Value::Integer(init as i64 + 1)),
            Cap::Len(n) => Ok(Value::String(lua.create_string(&self.src[init..init + n])?)),
        }
    }

    /// All captures (or the whole match, with `whole`); none for `find`
    /// without captures.
    fn captures(&self, lua: &Lua, s: usize, e: usize, whole: bool) -> R<Vec<Value>> {
        let n = if self.level == 0 && whole { 1 } else { self.level };
        (0..n).map(|i| self.capture_value(lua, i, s, e)).collect()
    }

    /// Charges the steps not charged yet: whole ticks now, the rest
    /// carried to the next pattern call of the same `decide` call.
    fn settle(&mut self) -> R<()> {
        let total = self.meter.carry.load(Ordering::Relaxed) + std::mem::take(&mut self.steps);
        self.meter.carry.store(total % STEPS_PER_TICK, Ordering::Relaxed);
        self.meter.take(total / STEPS_PER_TICK)
    }
}

/// Lua's `posrelatI`: a 1-based start from a possibly negative one.
fn start_index(init: Option<i64>, len: usize) -> usize {
    match init.unwrap_or(1) {
        i if i > 0 => i as usize,
        0 => 1,
        i if i < -(len as i64) => 1,
        i => (len as i64 + i + 1) as usize,
    }
}

fn state<'a>(src: &'a [u8], pat: &'a [u8], meter: &'a Meter) -> State<'a> {
    State { src, pat, depth: MAX_DEPTH, level: 0, capture: [(0, Cap::Unfinished); MAX_CAPTURES], steps: 0, meter }
}

/// `string.find` (`find`) and `string.match`.
fn find_aux(
    lua: &Lua,
    meter: &Meter,
    args: (mlua::LuaString, mlua::LuaString, Option<i64>, Value),
    find: bool,
) -> R<MultiValue> {
    let (s, p, init, plain) = args;
    let (src, pat) = (s.as_bytes(), p.as_bytes());
    let init = start_index(init, src.len()) - 1;
    let fail = || Ok(MultiValue::from_iter([Value::Nil]));
    if init > src.len() {
        return fail();
    }
    let plain = !matches!(plain, Value::Nil | Value::Boolean(false));
    if find && (plain || !pat.iter().any(|c| SPECIALS.contains(c))) {
        let mut st = state(&src, &pat, meter);
        let hay = &src[init..];
        let found = if pat.is_empty() {
            Some(0)
        } else {
            let mut at = None;
            for i in 0..hay.len().saturating_sub(pat.len() - 1) {
                st.steps += pat.len() as u64;
                if st.steps >= STEPS_PER_TICK {
                    st.settle()?;
                }
                if hay[i..i + pat.len()] == *pat {
                    at = Some(i);
                    break;
                }
            }
            at
        };
        st.settle()?;
        return match found {
            Some(i) => Ok(MultiValue::from_iter([
                Value::Integer((init + i + 1) as i64),
                Value::Integer((init + i + pat.len()) as i64),
            ])),
            None => fail(),
        };
    }
    let anchor = pat.first() == Some(&b'^');
    let pat = if anchor { &pat[1..] } else { &pat[..] };
    let mut st = state(&src, pat, meter);
    let mut s1 = init;
    loop {
        st.reset();
        if let Some(e) = st.do_match(s1, 0)? {
            st.settle()?;
            let caps = if find {
                let mut v = vec![Value::Integer(s1 as i64 + 1), Value::Integer(e as i64)];
                v.extend(st.captures(lua, s1, e, false)?);
                v
            } else {
                st.captures(lua, s1, e, true)?
            };
            return Ok(MultiValue::from_iter(caps));
        }
        s1 += 1;
        if s1 > src.len() || anchor {
            break;
        }
    }
    st.settle()?;
    fail()
}

/// `string.gmatch`: an iterator over the matches from `init`.
fn gmatch(lua: &Lua, meter: &Meter, (s, p, init): (mlua::LuaString, mlua::LuaString, Option<i64>)) -> R<Function> {
    let len = s.as_bytes().len();
    let mut init = start_index(init, len) - 1;
    if init > len {
        init = len + 1;
    }
    let pos = Cell::new(init);
    let last: Cell<Option<usize>> = Cell::new(None);
    let meter = meter.clone();
    lua.create_function(move |lua, ()| {
        let (src, pat) = (s.as_bytes(), p.as_bytes());
        let mut st = state(&src, &pat, &meter);
        let mut at = pos.get();
        while at <= src.len() {
            st.reset();
            if let Some(e) = st.do_match(at, 0)? {
                if Some(e) != last.get() {
                    st.settle()?;
                    pos.set(e);
                    last.set(Some(e));
                    return Ok(MultiValue::from_iter(st.captures(lua, at, e, true)?));
                }
            }
            at += 1;
        }
        pos.set(at);
        st.settle()?;
        Ok(MultiValue::new())
    })
}

/// `string.gsub`.
fn gsub(
    lua: &Lua,
    meter: &Meter,
    (s, p, repl, max): (mlua::LuaString, mlua::LuaString, Value, Option<i64>),
) -> R<(Value, i64)> {
    let (src, pat) = (s.as_bytes(), p.as_bytes());
    if !matches!(repl, Value::String(_) | Value::Integer(_) | Value::Number(_) | Value::Table(_) | Value::Function(_)) {
        return err(format!("bad argument #3 to 'gsub' (string/function/table expected, got {})", repl.type_name()));
    }
    let repl_text = match &repl {
        Value::Table(_) | Value::Function(_) => None,
        v => Some(lua.coerce_string(v.clone())?.expect("a string or a number").as_bytes().to_vec()),
    };
    let max = max.unwrap_or(src.len() as i64 + 1);
    let anchor = pat.first() == Some(&b'^');
    let pat = if anchor { &pat[1..] } else { &pat[..] };
    let mut st = state(&src, pat, meter);
    let mut out: Vec<u8> = Vec::new();
    let (mut at, mut n, mut changed, mut last) = (0usize, 0i64, false, None);
    while n < max {
        st.reset();
        match st.do_match(at, 0)? {
            Some(e) if Some(e) != last => {
                n += 1;
                st.settle()?;
                changed |= add_value(lua, &st, &mut out, at, e, &repl, repl_text.as_deref())?;
                at = e;
                last = Some(e);
            }
            _ if at < src.len() => {
                out.push(src[at]);
                at += 1;
            }
            _ => break,
        }
        if anchor {
            break;
        }
    }
    st.settle()?;
    if !changed {
        return Ok((Value::String(s.clone()), n));
    }
    out.extend_from_slice(&src[at..]);
    Ok((Value::String(lua.create_string(&out)?), n))
}

/// Appends the replacement of the match `s..e`; returns whether it changed
/// the text.
fn add_value(
    lua: &Lua,
    st: &State,
    out: &mut Vec<u8>,
    s: usize,
    e: usize,
    repl: &Value,
    text: Option<&[u8]>,
) -> R<bool> {
    let value = match (repl, text) {
        (_, Some(t)) => {
            let mut i = 0;
            while i < t.len() {
                if t[i] != b'%' {
                    out.push(t[i]);
                    i += 1;
                    continue;
                }
                i += 1;
                match t.get(i).copied() {
                    Some(b'%') => out.push(b'%'),
                    Some(b'0') => out.extend_from_slice(&st.src[s..e]),
                    Some(d) if d.is_ascii_digit() => match st.capture_value(lua, (d - b'1') as usize, s, e)? {
                        Value::String(c) => out.extend_from_slice(&c.as_bytes()),
                        Value::Integer(pos) => out.extend_from_slice(pos.to_string().as_bytes()),
                        _ => unreachable!("captures are strings or positions"),
                    },
                    _ => return err("invalid use of '%' in replacement string"),
                }
                i += 1;
            }
            return Ok(true);
        }
        (Value::Function(f), None) => f.call::<Value>(Variadic::from_iter(st.captures(lua, s, e, true)?))?,
        (Value::Table(t), None) => Table::get::<Value>(t, st.capture_value(lua, 0, s, e)?)?,
        _ => unreachable!("checked by gsub"),
    };
    match value {
        Value::Nil | Value::Boolean(false) => {
            out.extend_from_slice(&st.src[s..e]);
            Ok(false)
        }
        v @ (Value::String(_) | Value::Integer(_) | Value::Number(_)) => {
            out.extend_from_slice(&lua.coerce_string(v)?.expect("a string or a number").as_bytes());
            Ok(true)
        }
        v => err(format!("invalid replacement value (a {})", v.type_name())),
    }
}

/// Replaces `string.find`, `match`, `gmatch` and `gsub` with the metered
/// ones.
pub fn install(lua: &Lua, meter: Meter) -> mlua::Result<()> {
    let string: Table = lua.globals().get("string")?;
    let m = meter.clone();
    string.set("find", lua.create_function(move |lua, args| find_aux(lua, &m, args, true))?)?;
    let m = meter.clone();
    string.set(
        "match",
        lua.create_function(move |lua, (s, p, init): (mlua::LuaString, mlua::LuaString, Option<i64>)| {
            find_aux(lua, &m, (s, p, init, Value::Nil), false)
        })?,
    )?;
    let m = meter.clone();
    string.set("gmatch", lua.create_function(move |lua, args| gmatch(lua, &m, args))?)?;
    let m = meter;
    string.set("gsub", lua.create_function(move |lua, args| gsub(lua, &m, args))?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlua::{LuaOptions, StdLib};

    fn meter(ticks: u32) -> Meter {
        Meter {
            ticks_left: Arc::new(AtomicU32::new(ticks)),
            exceeded: Arc::new(AtomicBool::new(false)),
            carry: Arc::new(AtomicU64::new(0)),
            message: Arc::from("budget exceeded"),
        }
    }

    /// A Lua state whose `string` has the metered functions and `native`
    /// Lua's own, with a helper that runs one under pcall and describes
    /// every value it returned.
    fn states() -> Lua {
        let lua = Lua::new_with(StdLib::STRING | StdLib::TABLE, LuaOptions::default()).unwrap();
        lua.load(
            r#"
            native = { find = string.find, match = string.match, gmatch = string.gmatch, gsub = string.gsub }
            function describe(f, ...)
              local r = table.pack(pcall(f, ...))
              if not r[1] then return "error" end
              local out = {}
              for i = 2, r.n do out[#out + 1] = type(r[i]) .. ":" .. tostring(r[i]) end
              return table.concat(out, ",")
            end
            function all(gm, s, p)
              local out = {}
              for a, b in gm(s, p) do out[#out + 1] = tostring(a) .. "/" .. tostring(b) end
              return table.concat(out, ";")
            end
            "#,
        )
        .exec()
        .unwrap();
        install(&lua, meter(u32::MAX)).unwrap();
        lua
    }

    /// Compares the metered functions with Lua's own on patterns made of
    /// the items Lua knows (classes, sets, repetitions, captures, anchors,
    /// %b, %f, back-references) and subjects made of the bytes they name.
    #[test]
    fn the_metered_functions_give_lua_s_own_results() {
        let lua = states();
        let items = [
            "a", "b", ".", "%a", "%d", "%s", "%w", "%p", "%A", "[ab]", "[^a]", "[a-c]", "[%d%-]", "(", ")", "()", "*",
            "+", "-", "?", "%1", "%b()", "%f[%w]", "^", "$", "%", "[", "x", " ", "%.",
        ];
        let bytes = b"aab(c) 1-2.x%[]^$";
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let describe: Function = lua.globals().get("describe").unwrap();
        let all: Function = lua.globals().get("all").unwrap();
        let native: Table = lua.globals().get("native").unwrap();
        let string: Table = lua.globals().get("string").unwrap();
        let (mut compared, mut matched) = (0, 0);
        for _ in 0..6000 {
            let pat: String = (0..1 + next(6)).map(|_| items[next(items.len())]).collect();
            let subj: Vec<u8> = (0..next(14)).map(|_| bytes[next(bytes.len())]).collect();
            let subj = lua.create_string(&subj).unwrap();
            let init = [None, Some(1), Some(3), Some(-2), Some(40)][next(5)];
            for f in ["find", "match", "gsub"] {
                let (ours, theirs): (Function, Function) = (string.get(f).unwrap(), native.get(f).unwrap());
                let call = |g: &Function| -> String {
                    match f {
                        "gsub" => describe.call((g, &subj, pat.as_str(), "<%0|%1>")).unwrap(),
                        _ => describe.call((g, &subj, pat.as_str(), init)).unwrap(),
                    }
                };
                let (a, b) = (call(&ours), call(&theirs));
                assert_eq!(a, b, "{f}({:?}, {pat:?}, {init:?})", subj.to_string_lossy());
                compared += 1;
                matched += usize::from(a != "error" && !a.starts_with("nil"));
            }
            let (a, b): (mlua::Result<String>, mlua::Result<String>) = (
                all.call((string.get::<Function>("gmatch").unwrap(), &subj, pat.as_str())),
                all.call((native.get::<Function>("gmatch").unwrap(), &subj, pat.as_str())),
            );
            assert_eq!(a.is_ok(), b.is_ok(), "gmatch({:?}, {pat:?})", subj.to_string_lossy());
            if let (Ok(a), Ok(b)) = (a, b) {
                assert_eq!(a, b, "gmatch({:?}, {pat:?})", subj.to_string_lossy());
            }
        }
        // The cases exercised the matcher, not only its errors.
        assert!(matched > compared / 5, "{matched} of {compared} calls matched");
        // Plain find, function and table replacements, a replacement count.
        for (code, want) in [
            ("return string.find('a.b', '.', 1, true)", "2 2"),
            ("return string.find('abc', '', 4)", "4 3"),
            ("return (string.gsub('hello world', '%w+', function(w) return w:upper() end))", "HELLO WORLD"),
            ("return (string.gsub('$x $y', '%$(%w)', { x = 1 }))", "1 $y"),
            ("return string.gsub('aaa', 'a', 'b', 2)", "bba 2"),
            ("return string.gsub('abc', '', '-')", "-a-b-c- 4"),
        ] {
            let v: MultiValue = lua.load(code).eval().unwrap();
            let got: Vec<String> = v.iter().map(|v| v.to_string().unwrap()).collect();
            assert_eq!(got.join(" "), want, "{code}");
        }
    }

    /// A pattern whose backtracking is exponential in its items stops at
    /// the budget, quickly, where Lua's own matcher would run for minutes.
    #[test]
    fn backtracking_is_charged_to_the_budget() {
        let lua = Lua::new_with(StdLib::STRING, LuaOptions::default()).unwrap();
        // Ten ticks (100,000 steps, ~10 ms in a debug build) against the
        // ~4.5 million backtracking steps of the whole match (over a second
        // unmetered): stopped mid-match, it costs a small part of that, in
        // the thread's own CPU time whatever the machine's load.
        let m = meter(10);
        install(&lua, m.clone()).unwrap();
        let started = crate::policy_script::tests::thread_cpu_time();
        let r = lua.load("return string.find(string.rep('a', 300), '.-.-.-b')").exec();
        let e = r.expect_err("the budget ends the match");
        assert!(e.to_string().contains("budget exceeded"), "{e}");
        assert!(m.exceeded.load(Ordering::Relaxed));
        let took = crate::policy_script::tests::thread_cpu_time() - started;
        assert!(took < std::time::Duration::from_millis(300), "{took:?} of CPU");
        // A cheap match costs a small part of the budget: no tick is
        // rounded up per call.
        let m = meter(100);
        let lua = Lua::new_with(StdLib::STRING, LuaOptions::default()).unwrap();
        install(&lua, m.clone()).unwrap();
        lua.load("for i = 1, 2000 do assert(('python train.py'):find('train')) end").exec().unwrap();
        assert!(m.ticks_left.load(Ordering::Relaxed) >= 90, "{}", m.ticks_left.load(Ordering::Relaxed));
    }
}
