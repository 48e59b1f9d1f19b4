//! Checking, before any data moves, that the ranks' communication ops fit together.
//!
//! Every rank lists its function's communication ops (kind, attributes, types, where each was
//! built), the lists are gathered on every rank, and every rank checks them the same way:
//! the collectives must be the same sequence on every rank, and each rank's sends to a peer
//! under a tag must be the sequence of that peer's receives from it under that tag. A
//! mismatch is the same error on every rank, naming the first differing op on each side. MPI
//! would otherwise truncate a message on one rank and return Ok on another.

use super::{CommError, Communicator};
use kiln_ir::{Function, Op, OpClass, print::inst_line};
use std::collections::BTreeMap;

/// One communication op, as the ranks compare them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Site {
    kind: Kind,
    /// The op's name and attributes (a peer and a tag aside).
    op: String,
    /// The types it moves.
    types: String,
    /// The instruction as the text form prints it, and where it was built.
    at: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Collective,
    Send { peer: usize, tag: u64 },
    Recv { peer: usize, tag: u64 },
}

/// Checks that every rank's communication in `func` matches the others' (a no-op without a
/// communicator of several ranks, or when `func` does not communicate). Every rank that
/// prepares a communicating function must call this for it, in the same order: it is itself
/// a pair of collectives.
pub fn check_function(func: &Function) -> Result<(), CommError> {
    let Some(comm) = Communicator::current() else {
        return Ok(());
    };
    let mine = sites(func);
    if comm.size() == 1 || mine.is_empty() {
        return Ok(());
    }
    let texts = comm.all_gather_text(&encode(&mine))?;
    let ranks: Vec<Vec<Site>> = texts.iter().map(|t| decode(t)).collect();
    match first_mismatch(&ranks) {
        None => Ok(()),
        Some(message) => Err(CommError::Mismatch {
            rank: comm.rank(),
            message: format!(
                "the ranks' communication does not match, so nothing was sent: {message}"
            ),
        }),
    }
}

/// The communication ops of `func`, in layout order (regions included).
fn sites(func: &Function) -> Vec<Site> {
    (func.walk_insts().into_iter())
        .filter(|&i| func.inst(i).op.class() == OpClass::Communication)
        .map(|i| {
            let data = func.inst(i);
            let moved = match data.op {
                Op::Recv { .. } => &data.results,
                _ => &data.args,
            };
            let types: Vec<String> = (moved.iter())
                .map(|&v| func.value_type(v).to_string())
                .collect();
            let kind = match data.op {
                Op::Send { peer, tag } => Kind::Send { peer, tag },
                Op::Recv { peer, tag, .. } => Kind::Recv { peer, tag },
                _ => Kind::Collective,
            };
            let attrs: String = (data.op.attributes().iter())
                .filter(|(name, _)| !matches!(*name, "peer" | "tag"))
                .map(|(name, value)| format!(" {name}={value}"))
                .collect();
            Site {
                kind,
                op: format!("{}{attrs}", data.op.name()),
                types: types.join(", "),
                at: format!("`{}` built at {}", inst_line(func, i).trim(), data.loc),
            }
        })
        .collect()
}

impl Site {
    /// The op with what it moves.
    fn what(&self) -> String {
        format!("{} ({})", self.op, self.types)
    }
}

/// The first way in which the ranks' sites do not fit together, as a sentence.
fn first_mismatch(ranks: &[Vec<Site>]) -> Option<String> {
    collective_mismatch(ranks).or_else(|| point_to_point_mismatch(ranks))
}

fn collective_mismatch(ranks: &[Vec<Site>]) -> Option<String> {
    let collectives: Vec<Vec<&Site>> = (ranks.iter())
        .map(|r| r.iter().filter(|s| s.kind == Kind::Collective).collect())
        .collect();
    let first = &collectives[0];
    for (rank, theirs) in collectives.iter().enumerate().skip(1) {
        let longest = first.len().max(theirs.len());
        let key = |s: &&Site| (s.op.clone(), s.types.clone());
        let differs = |i: usize| first.get(i).map(key) != theirs.get(i).map(key);
        let Some(at) = (0..longest).find(|&i| differs(i)) else {
            continue;
        };
        let describe = |rank: usize, site: Option<&&Site>| match site {
            Some(s) => format!("rank {rank}'s is {} ({})", s.what(), s.at),
            None => format!("rank {rank} has none"),
        };
        return Some(format!(
            "collective #{} differs: {}; {}",
            at + 1,
            describe(0, first.get(at)),
            describe(rank, theirs.get(at))
        ));
    }
    None
}

fn point_to_point_mismatch(ranks: &[Vec<Site>]) -> Option<String> {
    // (from, to, tag) → the sends and the receives of that channel, in order.
    type Channel<'a> = (Vec<&'a Site>, Vec<&'a Site>);
    let mut channels: BTreeMap<(usize, usize, u64), Channel<'_>> = BTreeMap::new();
    for (rank, sites) in ranks.iter().enumerate() {
        for site in sites {
            match site.kind {
                Kind::Send { peer, tag } => {
                    channels.entry((rank, peer, tag)).or_default().0.push(site)
                }
                Kind::Recv { peer, tag } => {
                    channels.entry((peer, rank, tag)).or_default().1.push(site)
                }
                Kind::Collective => {}
            }
        }
    }
    for ((from, to, tag), (sends, recvs)) in &channels {
        let longest = sends.len().max(recvs.len());
        let types = |s: &&Site| s.types.clone();
        let differs = |i: usize| sends.get(i).map(types) != recvs.get(i).map(types);
        let Some(at) = (0..longest).find(|&i| differs(i)) else {
            continue;
        };
        let send = match sends.get(at) {
            Some(s) => format!(
                "rank {from} sends ({}) to rank {to} with tag {tag} ({})",
                s.types, s.at
            ),
            None => format!("rank {from} sends nothing more to rank {to} with tag {tag}"),
        };
        let recv = match recvs.get(at) {
            Some(r) => format!("rank {to} receives ({}) ({})", r.types, r.at),
            None => format!("rank {to} receives nothing from rank {from} with tag {tag}"),
        };
        return Some(format!("{send}, but {recv}"));
    }
    None
}

/// Each site as one line of tab-separated fields.
fn encode(sites: &[Site]) -> String {
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    (sites.iter())
        .map(|s| {
            let kind = match s.kind {
                Kind::Collective => "c".to_owned(),
                Kind::Send { peer, tag } => format!("s {peer} {tag}"),
                Kind::Recv { peer, tag } => format!("r {peer} {tag}"),
            };
            format!(
                "{kind}\t{}\t{}\t{}\n",
                clean(&s.op),
                clean(&s.types),
                clean(&s.at)
            )
        })
        .collect()
}

fn decode(text: &str) -> Vec<Site> {
    (text.lines())
        .filter_map(|line| {
            let mut fields = line.splitn(4, '\t');
            let (kind, op, types, at) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            let mut words = kind.split(' ');
            let letter = words.next()?;
            let mut number = || words.next()?.parse().ok();
            let kind = match letter {
                "s" => Kind::Send {
                    peer: number()? as usize,
                    tag: number()?,
                },
                "r" => Kind::Recv {
                    peer: number()? as usize,
                    tag: number()?,
                },
                _ => Kind::Collective,
            };
            Some(Site {
                kind,
                op: op.to_owned(),
                types: types.to_owned(),
                at: at.to_owned(),
            })
        })
        .collect()
}
