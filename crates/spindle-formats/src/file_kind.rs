//! What kind of file-system entry a model path is, checked before it is
//! opened: `open()` on a FIFO with no writer blocks for ever, and a symlink
//! loop would otherwise read as a bare OS error.

use std::fs::{self, FileType, Metadata};
use std::io;
use std::path::Path;

use crate::error::FormatError;

/// The metadata of `path`, following symlinks. A symlink loop is
/// [`FormatError::SymlinkLoop`]; other failures are [`FormatError::Io`].
pub fn metadata(path: &Path) -> Result<Metadata, FormatError> {
    fs::metadata(path).map_err(|source| {
        if is_symlink_loop(&source) {
            FormatError::SymlinkLoop {
                path: path.to_path_buf(),
            }
        } else {
            FormatError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// Checks that `path` is (or links to) a regular file, so that opening and
/// reading it cannot block; `expected` names what it should be ("a model
/// file") for the error.
pub fn require_file(path: &Path, expected: &'static str) -> Result<Metadata, FormatError> {
    let meta = metadata(path)?;
    if !meta.is_file() {
        return Err(FormatError::WrongFileKind {
            path: path.to_path_buf(),
            found: kind_name(meta.file_type()),
            expected,
        });
    }
    Ok(meta)
}

/// Checks that `path` is (or links to) a directory.
pub fn require_dir(path: &Path, expected: &'static str) -> Result<Metadata, FormatError> {
    let meta = metadata(path)?;
    if !meta.is_dir() {
        return Err(FormatError::WrongFileKind {
            path: path.to_path_buf(),
            found: kind_name(meta.file_type()),
            expected,
        });
    }
    Ok(meta)
}

/// Whether there is an entry of any kind at `path` (a dangling or looping
/// symlink counts), so that a broken one is reported rather than skipped.
pub fn entry_exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// "a regular file", "a FIFO (named pipe)", ...
pub fn kind_name(ft: FileType) -> &'static str {
    if ft.is_file() {
        return "a regular file";
    }
    if ft.is_dir() {
        return "a directory";
    }
    if ft.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_socket() {
            return "a socket";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
    }
    "not a regular file"
}

/// Whether `e` is ELOOP. std has no stable `ErrorKind` for it yet, and this
/// crate does not depend on libc, hence the per-platform numbers.
fn is_symlink_loop(e: &io::Error) -> bool {
    let linux_generic = cfg!(any(target_os = "linux", target_os = "android"))
        && !cfg!(any(
            target_arch = "mips",
            target_arch = "mips64",
            target_arch = "sparc",
            target_arch = "sparc64"
        ));
    let bsd = cfg!(any(
        target_vendor = "apple",
        target_os = "freebsd",
        target_os = "netbsd",
        target_os = "openbsd",
        target_os = "dragonfly"
    ));
    let eloop = if linux_generic {
        40
    } else if bsd {
        62
    } else {
        return false;
    };
    e.raw_os_error() == Some(eloop)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::storage::Storage;

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("run mkfifo");
        assert!(status.success(), "mkfifo failed");
    }

    /// Runs `f` on its own thread; fails the test instead of hanging when
    /// it does not return in time (opening a FIFO blocks for ever).
    fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("opening the path blocked: it must be refused before open()")
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.gguf");
        mkfifo(&fifo);
        let p = fifo.clone();
        let e = within_5s(move || Storage::map(&p).map(|_| ()).unwrap_err());
        assert!(
            matches!(&e, FormatError::WrongFileKind { path, .. } if *path == fifo),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("is a FIFO (named pipe), not a model file"),
            "{msg}"
        );
        let p = fifo.clone();
        let e = within_5s(move || crate::GgufFile::open(&p).map(|_| ()).unwrap_err());
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn a_symlink_loop_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let e = Storage::map(&a).unwrap_err();
        assert!(
            matches!(&e, FormatError::SymlinkLoop { path } if *path == a),
            "{e}"
        );
        assert!(e.to_string().contains("symlink loop"), "{e}");
        assert!(entry_exists(&a));
    }

    #[test]
    fn safetensors_dirs_refuse_fifos_and_loops() {
        use crate::safetensors_dir::{is_hf_dir, SafetensorsModel};
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        fs::write(d.join("config.json"), "{}").unwrap();
        mkfifo(&d.join("model.safetensors"));
        let p = d.clone();
        let e = within_5s(move || SafetensorsModel::open(&p).unwrap_err());
        assert!(e.to_string().contains("model.safetensors is a FIFO"), "{e}");

        // A FIFO config.json still marks the directory, and is then refused.
        fs::remove_file(d.join("config.json")).unwrap();
        mkfifo(&d.join("config.json"));
        assert!(is_hf_dir(&d));
        let p = d.clone();
        let e = within_5s(move || SafetensorsModel::open(&p).unwrap_err());
        assert!(e.to_string().contains("config.json is a FIFO"), "{e}");

        let (a, b) = (d.join("a"), d.join("b"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let e = SafetensorsModel::open(&a).unwrap_err();
        assert!(e.to_string().contains("symlink loop"), "{e}");
    }

    #[test]
    fn a_directory_is_not_a_model_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = Storage::map(dir.path()).unwrap_err();
        assert!(
            e.to_string().contains("is a directory, not a model file"),
            "{e}"
        );
        assert!(require_dir(dir.path(), "a directory").is_ok());
    }

    #[test]
    fn a_missing_file_stays_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = Storage::map(&dir.path().join("nope.gguf")).unwrap_err();
        assert!(
            matches!(&e, FormatError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound),
            "{e}"
        );
    }

    #[test]
    fn kinds_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        mkfifo(&fifo);
        let kind = |p: &Path| kind_name(fs::symlink_metadata(p).unwrap().file_type());
        assert_eq!(kind(&fifo), "a FIFO (named pipe)");
        assert_eq!(kind(Path::new("/dev/null")), "a character device");
        assert_eq!(kind(dir.path()), "a directory");
    }
}
