//! Where an instruction came from: a line of IR text, the Rust source line that built it, or
//! the node of an imported graph (an ONNX node) it was converted from.

use std::collections::HashSet;
use std::fmt;
use std::sync::{LazyLock, Mutex};

/// A node of an imported graph: its name (`#12`, its position, when it has none) and op type.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SourceNode {
    /// The node's name.
    pub name: Box<str>,
    /// Its op type, with the domain when not the default one (`com.microsoft.FusedMatMul`).
    pub op: Box<str>,
}

impl fmt::Display for SourceNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {:?} ({})", &*self.name, self.op)
    }
}

/// Every distinct node location made in this process, kept for its length so that [`Loc`]
/// stays `Copy` and small: an import adds each node name once.
static NODES: LazyLock<Mutex<HashSet<&'static SourceNode>>> = LazyLock::new(Default::default);

/// Where an instruction comes from: a line of the caller's Rust, or a position in IR text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Loc {
    /// Not known (built by a pass, say).
    #[default]
    Unknown,
    /// A position in IR text.
    Text {
        /// The line, from 1.
        line: u32,
        /// The column, from 1.
        col: u32,
    },
    /// The caller of a builder method (captured with `#[track_caller]`).
    Rust(&'static std::panic::Location<'static>),
    /// The node of an imported graph the instruction was converted from, and its position in
    /// IR text when it was parsed from text (line 0 when not).
    Node {
        /// The node.
        node: &'static SourceNode,
        /// The line, from 1 (0: not from text).
        line: u32,
        /// The column, from 1.
        col: u32,
    },
}

impl Loc {
    /// The location of the caller (through `#[track_caller]` functions).
    #[track_caller]
    pub fn caller() -> Loc {
        Loc::Rust(std::panic::Location::caller())
    }

    /// The location of the imported node `name` of type `op`.
    pub fn node(name: &str, op: &str) -> Loc {
        let key = SourceNode {
            name: name.into(),
            op: op.into(),
        };
        let mut nodes = NODES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let node = match nodes.get(&key) {
            Some(&node) => node,
            None => {
                let node: &'static SourceNode = Box::leak(Box::new(key));
                nodes.insert(node);
                node
            }
        };
        Loc::Node {
            node,
            line: 0,
            col: 0,
        }
    }

    /// This location, at `line` and `col` of IR text: a node keeps its node.
    pub fn at_text(self, line: u32, col: u32) -> Loc {
        match self {
            Loc::Node { node, .. } => Loc::Node { node, line, col },
            _ => Loc::Text { line, col },
        }
    }

    /// Whether the location is known.
    pub fn is_known(&self) -> bool {
        !matches!(self, Loc::Unknown)
    }

    /// The line and column of IR text, when the instruction was parsed from text.
    pub fn text_position(&self) -> Option<(u32, u32)> {
        match *self {
            Loc::Text { line, col } => Some((line, col)),
            Loc::Node { line, col, .. } if line > 0 => Some((line, col)),
            _ => None,
        }
    }

    /// The imported node, when the instruction was converted from one.
    pub fn source_node(&self) -> Option<&'static SourceNode> {
        match *self {
            Loc::Node { node, .. } => Some(node),
            _ => None,
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Unknown => f.write_str("an unknown place"),
            Loc::Text { line, col } => write!(f, "line {line}, column {col}"),
            Loc::Rust(l) => write!(f, "{}:{}:{}", l.file(), l.line(), l.column()),
            Loc::Node { node, line: 0, .. } => write!(f, "{node}"),
            Loc::Node { node, line, col } => write!(f, "line {line}, column {col}, {node}"),
        }
    }
}
