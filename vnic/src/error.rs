//! The daemon's errors.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--trace {}: {source}", path.display())]
    Trace {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--peer tap:{name}: {source}")]
    Tap {
        name: String,
        source: std::io::Error,
    },
    #[error("filter table: {0}")]
    Table(#[from] arfs::ConfigError),
    #[error("timerfd: {0}")]
    Timer(std::io::Error),
    #[error("{what} {}: {source}", path.display())]
    Socket {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {}: {why}", path.display())]
    SocketInUse {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("event manager: {0}")]
    EventManager(String),
    #[error("vhost-user: {0}")]
    VhostUser(String),
    /// Options that parse one by one but do not go together.
    #[error("{0}")]
    Options(#[from] crate::config::InvalidValue),
}

impl Error {
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { what, source }
    }

    pub fn socket<'a>(
        what: &'static str,
        path: &'a std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| Self::Socket {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}
