//! Cheap repeated reads of /proc files.
//!
//! A /proc/<pid>/... file is a seq_file: every read at offset 0 makes the
//! kernel regenerate its text. So a file is opened once and re-read with
//! `pread(fd, buf, 0)`, saving the open (path walk, permission check) and
//! close of every pass: on the reference VM an open+read+close of
//! `schedstat` costs ~7 µs, a pread ~1.5 µs. A file is read until a read
//! returns nothing: a short read is not the end of a seq_file.
//!
//! Cached fds are limited by an [`FdBudget`]; without budget a file is
//! opened and closed per read. A cached fd pins the `struct pid`, not the
//! task: once the task exits, reads fail with ESRCH (mapped to
//! [`ReadError::Gone`]), even if the id was recycled meanwhile.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Why a read failed. All are normal input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// ENOENT/ESRCH: the task is gone.
    Gone,
    /// EACCES/EPERM: not ours to read.
    Denied,
    /// Anything else (EIO, unexpected content...).
    Other,
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESRCH) | Some(libc::ENOTDIR) => ReadError::Gone,
            Some(libc::EACCES) | Some(libc::EPERM) => ReadError::Denied,
            _ => ReadError::Other,
        }
    }
}

/// Largest file we read (guards against absurd sizes).
const MAX_READ: usize = 16 << 20;

/// Shared count of cached fds against a limit.
#[derive(Debug, Clone)]
pub struct FdBudget {
    used: Arc<AtomicUsize>,
    limit: usize,
}

/// One unit of the budget; returned on drop.
#[derive(Debug)]
pub struct FdToken(Arc<AtomicUsize>);

impl Drop for FdToken {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl FdBudget {
    pub fn new(limit: usize) -> FdBudget {
        FdBudget { used: Arc::new(AtomicUsize::new(0)), limit }
    }

    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self) -> Option<FdToken> {
        if self.used.fetch_add(1, Ordering::Relaxed) < self.limit {
            Some(FdToken(self.used.clone()))
        } else {
            self.used.fetch_sub(1, Ordering::Relaxed);
            None
        }
    }

    /// Raises the soft RLIMIT_NOFILE so that `limit` cached fds plus some
    /// headroom fit, and lowers the limit to what the process may open.
    pub fn fit_rlimit(limit: usize) -> usize {
        const HEADROOM: u64 = 256;
        let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit only write/read the struct we pass.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
                return limit.min(512);
            }
            let want = (limit as u64).saturating_add(HEADROOM);
            if rl.rlim_cur < want && rl.rlim_cur < rl.rlim_max {
                let mut raised = rl;
                raised.rlim_cur = want.min(rl.rlim_max);
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    rl = raised;
                }
            }
        }
        (limit as u64).min(rl.rlim_cur.saturating_sub(HEADROOM)) as usize
    }
}

/// A reusable read buffer (kept initialised so pread can write into it).
#[derive(Debug)]
pub struct ReadBuf {
    data: Vec<u8>,
    len: usize,
}

impl Default for ReadBuf {
    fn default() -> Self {
        ReadBuf { data: vec![0; 4096], len: 0 }
    }
}

impl ReadBuf {
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }

    /// The content as text (lossy only when the file holds invalid UTF-8).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.bytes())
    }

    /// Reads `file` from offset 0 to EOF.
    fn fill(&mut self, file: &File) -> io::Result<()> {
        self.fill_with(|buf, off| file.read_at(buf, off), false)
    }

    /// Reads a file the kernel shows as one record (`proc_single_show`:
    /// a task's stat, schedstat, status, io, comm, cgroup): the
    /// whole text is made at the first read, so a read shorter than the
    /// buffer is the end, and one pread is enough where [`fill`](Self::fill)
    /// needs a second, empty one.
    fn fill_record(&mut self, file: &File) -> io::Result<()> {
        self.fill_with(|buf, off| file.read_at(buf, off), true)
    }

    /// Reads from offset 0 until a read returns nothing (or, with
    /// `short_is_end`, less than it asked for). A short read is not the end
    /// in general: a seq_file (`/proc/<pid>/maps`, `mountinfo`...) returns at
    /// most about a page per read(), whatever the buffer's size. The last,
    /// empty, read is at the offset where the previous one stopped, which
    /// the seq_file serves without regenerating the text.
    fn fill_with(
        &mut self,
        mut read_at: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
        short_is_end: bool,
    ) -> io::Result<()> {
        self.len = 0;
        loop {
            if self.len == self.data.len() {
                if self.data.len() >= MAX_READ {
                    return Err(io::Error::from_raw_os_error(libc::EFBIG));
                }
                let n = self.data.len() * 2;
                self.data.resize(n, 0);
            }
            let room = self.data.len() - self.len;
            match read_at(&mut self.data[self.len..], self.len as u64) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    self.len += n;
                    if short_is_end && n < room {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads a whole file by path (open, read, close).
    pub fn read_path(&mut self, path: &Path) -> Result<(), ReadError> {
        let file = File::open(path)?;
        Ok(self.fill(&file)?)
    }
}

/// A /proc file that stays open between reads when the budget allows.
#[derive(Debug, Default)]
pub struct ProcFile {
    cached: Option<(File, FdToken)>,
}

impl ProcFile {
    /// Reads the file into `buf`. `path` is only called when the file must
    /// be opened.
    pub fn read(
        &mut self,
        path: impl FnOnce() -> std::path::PathBuf,
        budget: &FdBudget,
        buf: &mut ReadBuf,
    ) -> Result<(), ReadError> {
        self.read_with(false, path, budget, buf)
    }

    /// [`read`](Self::read) for a file the kernel shows as one record (see
    /// `ReadBuf::fill_record`): one pread instead of two.
    pub fn read_record(
        &mut self,
        path: impl FnOnce() -> std::path::PathBuf,
        budget: &FdBudget,
        buf: &mut ReadBuf,
    ) -> Result<(), ReadError> {
        self.read_with(true, path, budget, buf)
    }

    fn read_with(
        &mut self,
        record: bool,
        path: impl FnOnce() -> std::path::PathBuf,
        budget: &FdBudget,
        buf: &mut ReadBuf,
    ) -> Result<(), ReadError> {
        let fill = |buf: &mut ReadBuf, file: &File| if record { buf.fill_record(file) } else { buf.fill(file) };
        if let Some((file, _)) = &self.cached {
            return match fill(buf, file) {
                Ok(()) => Ok(()),
                Err(e) => {
                    self.cached = None;
                    Err(e.into())
                }
            };
        }
        let file = File::open(path())?;
        fill(buf, &file)?;
        if let Some(token) = budget.take() {
            self.cached = Some((file, token));
        }
        Ok(())
    }

    /// Closes the cached fd, if any.
    pub fn close(&mut self) {
        self.cached = None;
    }
}

/// A directory listed again and again (/proc, /proc/<pid>/task).
#[derive(Debug, Default)]
pub struct DirFile {
    cached: Option<(File, FdToken)>,
}

impl DirFile {
    /// Puts the numeric entries of the directory into `out` (sorted).
    pub fn list_numeric(
        &mut self,
        path: impl FnOnce() -> std::path::PathBuf,
        budget: &FdBudget,
        buf: &mut ReadBuf,
        out: &mut Vec<i32>,
    ) -> Result<(), ReadError> {
        out.clear();
        match &self.cached {
            Some((file, _)) => {
                if let Err(e) = getdents_numeric(file, buf, out) {
                    self.cached = None;
                    return Err(e.into());
                }
            }
            None => {
                let file = File::open(path())?;
                getdents_numeric(&file, buf, out)?;
                if let Some(token) = budget.take() {
                    self.cached = Some((file, token));
                }
            }
        }
        out.sort_unstable();
        Ok(())
    }
}

/// Lists a directory from its start with getdents64, keeping names that are
/// positive integers.
fn getdents_numeric(dir: &File, buf: &mut ReadBuf, out: &mut Vec<i32>) -> io::Result<()> {
    let fd = dir.as_raw_fd();
    // SAFETY: lseek on an fd we own.
    if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if buf.data.len() < 32768 {
        buf.data.resize(32768, 0);
    }
    loop {
        // SAFETY: the kernel writes at most data.len() bytes into data.
        let n = unsafe {
            libc::syscall(libc::SYS_getdents64, fd, buf.data.as_mut_ptr() as *mut libc::c_void, buf.data.len())
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        let data = &buf.data[..n as usize];
        let mut off = 0usize;
        // struct linux_dirent64 { u64 ino; i64 off; u16 reclen; u8 type; char name[]; }
        while off + 19 < data.len() {
            let reclen = u16::from_ne_bytes([data[off + 16], data[off + 17]]) as usize;
            if reclen == 0 || off + reclen > data.len() {
                break;
            }
            let name = &data[off + 19..off + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(id) = parse_id(name) {
                out.push(id);
            }
            off += reclen;
        }
    }
}

/// Parses a positive decimal id ("1234"), rejecting anything else.
pub fn parse_id(name: &[u8]) -> Option<i32> {
    if name.is_empty() || name.len() > 10 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(name).ok()?.parse::<i32>().ok().filter(|&v| v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_numeric_entries_and_rereads_files() {
        let dir = crate::observe::fixture::TempDir::new("procfile");
        for name in ["12", "3", "self", "0", "x1"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        let budget = FdBudget::new(8);
        let mut d = DirFile::default();
        let mut buf = ReadBuf::default();
        let mut out = vec![];
        d.list_numeric(|| dir.path().to_path_buf(), &budget, &mut buf, &mut out).unwrap();
        assert_eq!(out, vec![3, 12]);
        std::fs::create_dir(dir.path().join("7")).unwrap();
        d.list_numeric(|| unreachable!("cached"), &budget, &mut buf, &mut out).unwrap();
        assert_eq!(out, vec![3, 7, 12]);
        assert_eq!(budget.used(), 1);

        let f = dir.path().join("f");
        std::fs::write(&f, "hello").unwrap();
        let mut pf = ProcFile::default();
        pf.read(|| f.clone(), &budget, &mut buf).unwrap();
        assert_eq!(buf.bytes(), b"hello");
        std::fs::write(&f, "a much longer content").unwrap();
        pf.read(|| unreachable!("cached"), &budget, &mut buf).unwrap();
        assert_eq!(buf.text(), "a much longer content");
        drop(pf);
        assert_eq!(budget.used(), 1);

        let mut missing = ProcFile::default();
        let err = missing.read(|| dir.path().join("nope"), &budget, &mut buf).unwrap_err();
        assert_eq!(err, ReadError::Gone);
    }

    #[test]
    fn budget_exhausted_still_reads() {
        let dir = crate::observe::fixture::TempDir::new("procfile-budget");
        let f = dir.path().join("f");
        std::fs::write(&f, vec![b'x'; 10_000]).unwrap();
        let budget = FdBudget::new(0);
        let mut pf = ProcFile::default();
        let mut buf = ReadBuf::default();
        pf.read(|| f.clone(), &budget, &mut buf).unwrap();
        assert_eq!(buf.bytes().len(), 10_000);
        assert_eq!(budget.used(), 0);
        pf.read(|| f.clone(), &budget, &mut buf).unwrap();
        assert_eq!(buf.bytes().len(), 10_000);
    }

    /// A reader that serves `content` at most `chunk` bytes per call, as a
    /// seq_file serves about a page per read() whatever the buffer's size.
    fn chunked(content: &[u8], chunk: usize) -> impl FnMut(&mut [u8], u64) -> io::Result<usize> + '_ {
        move |buf, off| {
            let rest = content.get(off as usize..).unwrap_or_default();
            let n = rest.len().min(buf.len()).min(chunk);
            buf[..n].copy_from_slice(&rest[..n]);
            Ok(n)
        }
    }

    #[test]
    fn short_reads_are_not_the_end_of_the_file() {
        // A PyTorch process's maps: ~78 KB, the CUDA libraries far past the
        // first page.
        let mut maps = String::new();
        for i in 0..1000 {
            maps.push_str(&format!("7f{i:010x}-7f{i:010x} r-xp 00000000 08:01 {i} /usr/lib/libfoo{i}.so\n"));
        }
        maps.push_str("7fff00000000-7fff00001000 r-xp 00000000 08:01 9 /venv/lib/libtorch_cuda.so\n");
        let mut buf = ReadBuf::default();
        buf.fill_with(chunked(maps.as_bytes(), 3500), false).unwrap();
        assert_eq!(buf.bytes(), maps.as_bytes());
        // Chunks that straddle the buffer's doubling, and one byte at a time.
        for chunk in [1, 4095, 4096, 4097, 1 << 20] {
            buf.fill_with(chunked(maps.as_bytes(), chunk), false).unwrap();
            assert_eq!(buf.bytes().len(), maps.len(), "chunk {chunk}");
        }
        // EINTR is retried; other errors are returned.
        let mut first = true;
        buf.fill_with(
            |b, off| {
                if std::mem::take(&mut first) {
                    return Err(io::Error::from_raw_os_error(libc::EINTR));
                }
                chunked(b"abc", 2)(b, off)
            },
            false,
        )
        .unwrap();
        assert_eq!(buf.bytes(), b"abc");
        let err = buf.fill_with(|_, _| Err(io::Error::from_raw_os_error(libc::EIO)), false);
        assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn a_one_record_file_is_read_with_one_pread() {
        // A reader that serves as much as asked, as the kernel does for a
        // proc_single_show file; counts its calls.
        let serve = |text: &'static [u8], calls: &'static std::sync::atomic::AtomicU32| {
            move |b: &mut [u8], off: u64| {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let rest = &text[(off as usize).min(text.len())..];
                let n = rest.len().min(b.len());
                b[..n].copy_from_slice(&rest[..n]);
                Ok(n)
            }
        };
        static SMALL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        static SMALL_EOF: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        static LARGE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let mut buf = ReadBuf::default();
        buf.fill_with(serve(b"1234 (x) S 1", &SMALL), true).unwrap();
        assert_eq!((buf.bytes(), SMALL.load(std::sync::atomic::Ordering::Relaxed)), (&b"1234 (x) S 1"[..], 1));
        buf.fill_with(serve(b"1234 (x) S 1", &SMALL_EOF), false).unwrap();
        assert_eq!(SMALL_EOF.load(std::sync::atomic::Ordering::Relaxed), 2, "a plain read ends on an empty read");
        // Longer than the buffer: a full read is not the end.
        let big: &'static [u8] = Box::leak(vec![b'x'; 6000].into_boxed_slice());
        buf.fill_with(serve(big, &LARGE), true).unwrap();
        assert_eq!((buf.bytes().len(), LARGE.load(std::sync::atomic::Ordering::Relaxed)), (6000, 2));
    }

    #[test]
    fn parse_id_rejects_junk() {
        assert_eq!(parse_id(b"42"), Some(42));
        assert_eq!(parse_id(b"0"), None);
        assert_eq!(parse_id(b"-1"), None);
        assert_eq!(parse_id(b"99999999999"), None);
        assert_eq!(parse_id(b""), None);
    }
}
