"""A depth-bounded suffix tree with counts: what followed every context seen, and how often.

Every suffix of every stored sequence, cut at `max_depth` tokens, is a path from the root; a node
counts the occurrences that pass through it, so child count ÷ sum of child counts is the empirical
probability of the next token after that context (SuffixDecoding, Oliaro et al., NeurIPS 2025).

Memory: a path is only expanded into nodes where two occurrences share it. An occurrence that is
alone below some node is one `Leaf` pointing into its stored sequence (like the path compression of
ArcticInference's C++ tree), so a unique stretch of text costs one leaf, not `max_depth` nodes.
A second occurrence arriving through a leaf splits it one level at a time.

A sequence may grow while it is stored (the request being generated): leaves read the growing
array, and an occurrence that ran out of tokens on an inner node waits in `_pending` until the
next tokens arrive. Drafting walks the most frequent child (`Node.best`; the latest one in a
`prefer_recent` tree) from the longest matched context, so a step costs O(match + draft), whatever
the amount of history. The children with their counts are all there, so a token tree could be read
from the same structure.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field


class Node:
    """A context seen at least twice (or the root)."""

    __slots__ = ("count", "total", "best", "children")

    def __init__(self, count: int = 0):
        self.count = count  # occurrences passing through or ending here
        self.total = 0  # sum of the children's counts: occurrences that continue past here
        self.best = -1  # token of the child with the highest count (the latest on a tie, or always: prefer_recent)
        self.children: dict[int, Node | Leaf] = {}


class Leaf:
    """One occurrence alone below its parent: the rest of its path is read from the stored sequence."""

    __slots__ = ("seq", "start")

    def __init__(self, seq: int, start: int):
        self.seq = seq
        self.start = start  # the occurrence is sequence[start:]; at depth d its next token is [start + d]


def child_count(child: Node | Leaf) -> int:
    return child.count if isinstance(child, Node) else 1


@dataclass
class DraftPath:
    """The most frequent continuation of a context: tokens, cumulative probabilities, their sum."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0

    @property
    def score(self) -> float:
        """Expected number of accepted tokens if each one is right with its cumulative probability."""
        return sum(self.probs)


@dataclass
class _Cursor:
    """Where a matched context ends: on a node, or inside a leaf's occurrence."""

    node: Node | None
    leaf: Leaf | None
    depth: int


class SuffixTree:
    def __init__(self, max_depth: int, prefer_recent: bool = False):
        """`prefer_recent`: draft the continuation seen last instead of the most frequent one (prompt
        lookup's rule, which copies the latest occurrence; within one request it drafts better)."""
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.prefer_recent = prefer_recent
        self._depth = max_depth + 1  # one level below the longest match, so a match has children
        self.root = Node()
        self._seqs: dict[int, array] = {}
        self._pending: dict[int, list[tuple[int, Node, int]]] = {}  # open sequences only
        self._next_id = 0
        self.stored_tokens = 0

    # ------------------------------------------------------------ building

    def open(self) -> int:
        """A new, empty sequence that grows with `extend`; returns its id."""
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = array("i")
        self._pending[sid] = []
        return sid

    def add(self, tokens: Sequence[int]) -> int:
        """Store a finished sequence; returns its id (for `remove`)."""
        sid = self.open()
        self.extend(sid, tokens)
        self.close(sid)
        return sid

    def extend(self, sid: int, tokens: Sequence[int]) -> None:
        """Append tokens to an open sequence and insert every suffix they create or lengthen."""
        seq = self._seqs[sid]
        first = len(seq)
        seq.extend(tokens)
        self.stored_tokens += len(seq) - first
        waiting, self._pending[sid] = self._pending[sid], []
        for start, node, depth in waiting:
            self._descend(sid, start, node, depth)
        for start in range(first, len(seq)):
            self.root.count += 1
            self._descend(sid, start, self.root, 0)

    def close(self, sid: int) -> None:
        """No more tokens for this sequence: occurrences that ran out simply end where they are."""
        self._pending.pop(sid, None)

    def is_open(self, sid: int) -> bool:
        return sid in self._pending

    def _descend(self, sid: int, start: int, node: Node, depth: int) -> None:
        """Carry occurrence `start` of `sid` down from `node` (which already counts it)."""
        seq = self._seqs[sid]
        limit = start + self._depth
        pos = start + depth
        end = min(len(seq), limit)
        while pos < end:
            token = seq[pos]
            child = node.children.get(token)
            if child is None:
                node.children[token] = Leaf(sid, start)
                node.total += 1
                if node is not self.root:
                    self._promote(node, token, 1)
                return
            if isinstance(child, Leaf):
                child = self._split(node, token, child, pos - start + 1)
            child.count += 1
            node.total += 1
            if node is not self.root:  # nothing drafts from the root: skip its (vocabulary-wide) bookkeeping
                self._promote(node, token, child.count)
            node = child
            pos += 1
        if pos < limit and sid in self._pending:
            self._pending[sid].append((start, node, pos - start))

    def _split(self, parent: Node, token: int, leaf: Leaf, depth: int) -> Node:
        """Turn a leaf into a node at `depth` holding its one occurrence; the leaf moves one level down."""
        node = Node(count=1)
        parent.children[token] = node
        seq = self._seqs[leaf.seq]
        nxt = leaf.start + depth
        if depth < self._depth and nxt < len(seq):
            node.children[seq[nxt]] = leaf
            node.total = 1
            node.best = seq[nxt]
        elif depth < self._depth and leaf.seq in self._pending:
            self._pending[leaf.seq].append((leaf.start, node, depth))
        return node

    def _promote(self, node: Node, token: int, count: int) -> None:
        best = node.children.get(node.best)
        if self.prefer_recent or best is None or count >= child_count(best):
            node.best = token

    # ------------------------------------------------------------ eviction

    def remove(self, sid: int) -> None:
        """Forget a stored sequence: every count it added is taken back, emptied nodes are freed."""
        seq = self._seqs.pop(sid)
        self._pending.pop(sid, None)
        self.stored_tokens -= len(seq)
        for start in range(len(seq)):
            self.root.count -= 1
            node = self.root
            single: tuple[Node, int, Node] | None = None  # the shallowest node left with one occurrence
            for pos in range(start, min(len(seq), start + self._depth)):
                token = seq[pos]
                child = node.children[token]
                node.total -= 1
                if isinstance(child, Leaf) or child.count == 1:
                    del node.children[token]
                    if node is not self.root:
                        self._rechoose(node, token)
                    break
                child.count -= 1
                if child.count == 1 and single is None:
                    single = (node, token, child)
                if node is not self.root:
                    self._rechoose(node, token)
                node = child
            if single is not None:
                self._compact(*single)

    @staticmethod
    def _compact(parent: Node, token: int, node: Node) -> None:
        """A node down to one occurrence becomes that occurrence's leaf again (when it ends in one)."""
        below: Node | Leaf = node
        while isinstance(below, Node) and len(below.children) == 1:
            below = next(iter(below.children.values()))
        if isinstance(below, Leaf):
            parent.children[token] = below

    @staticmethod
    def _rechoose(node: Node, token: int) -> None:
        """After a child lost count: if it was the best, find the new best (O(children), eviction only;
        a `prefer_recent` tree is a request's own and never evicts)."""
        if node.best != token:
            return
        node.best = -1
        best_count = 0
        for key, child in node.children.items():
            count = child_count(child)
            if count >= best_count:
                node.best, best_count = key, count

    # ------------------------------------------------------------ drafting

    def speculate(
        self, context: Sequence[int], max_tokens: int, max_spec_factor: float, min_token_prob: float, min_match: int = 1
    ) -> DraftPath:
        """The most frequent continuation after the longest suffix of `context` seen with one.

        Draft length <= max_spec_factor x match length (the paper's adaptive length); drafting stops
        when the cumulative probability of the next token falls below `min_token_prob`; a match
        shorter than `min_match` tokens drafts nothing.
        """
        tail = list(context[-self.max_depth :])
        cursor, match_len = self._longest_match(tail)
        if cursor is None or match_len < min_match:
            return DraftPath()
        budget = min(max_tokens, int(match_len * max_spec_factor + 1e-6))
        path = self._follow(cursor, tail[-match_len:], budget, min_token_prob)
        path.match_len = match_len
        return path

    def _longest_match(self, tail: list[int]) -> tuple[_Cursor | None, int]:
        """Binary search on the match length: a suffix that occurs with a continuation implies its own suffixes do."""
        lo, hi, found = 1, len(tail), None
        while lo <= hi:
            mid = (lo + hi) // 2
            cursor = self._locate(tail[len(tail) - mid :])
            if cursor is not None and self._continues(cursor):
                lo, found = mid + 1, cursor
            else:
                hi = mid - 1
        return found, hi

    def _locate(self, tokens: list[int]) -> _Cursor | None:
        node = self.root
        for i, token in enumerate(tokens):
            child = node.children.get(token)
            if child is None:
                return None
            if isinstance(child, Leaf):
                seq = self._seqs[child.seq]
                base = child.start
                if base + len(tokens) > len(seq) or any(seq[base + j] != tokens[j] for j in range(i + 1, len(tokens))):
                    return None
                return _Cursor(None, child, len(tokens))
            node = child
        return _Cursor(node, None, len(tokens))

    def _continues(self, cursor: _Cursor) -> bool:
        if cursor.leaf is not None:
            return cursor.leaf.start + cursor.depth < len(self._seqs[cursor.leaf.seq])
        return cursor.node is not None and cursor.node.total > 0

    def _follow(self, cursor: _Cursor, matched: list[int], budget: int, min_token_prob: float) -> DraftPath:
        path = DraftPath()
        prob = 1.0
        context = list(matched)  # the walked path: the match, then the draft
        while len(path.tokens) < budget:
            if cursor.leaf is not None:
                token = self._leaf_token(cursor.leaf, cursor.leaf.start + cursor.depth, path.tokens)
                if token is None:
                    break
            else:
                node = cursor.node
                assert node is not None
                if cursor.depth >= self._depth:  # no level below: re-anchor on a shorter context
                    shorter = self._locate(context[len(context) - cursor.depth + 1 :])
                    if shorter is None or not self._continues(shorter):
                        break
                    cursor = shorter
                    continue
                if node.total == 0:
                    break
                token = node.best
                child = node.children[token]
                prob *= child_count(child) / node.total
                if prob < min_token_prob:
                    break
                depth = cursor.depth
                cursor = _Cursor(child, None, depth) if isinstance(child, Node) else _Cursor(None, child, depth)
            path.tokens.append(token)
            path.probs.append(prob)
            context.append(token)
            cursor.depth += 1
        return path

    def _leaf_token(self, leaf: Leaf, index: int, drafted: list[int]) -> int | None:
        """The occurrence's next token; in a growing sequence past its end, the copy reads its own draft."""
        seq = self._seqs[leaf.seq]
        if index < len(seq):
            return seq[index]
        if leaf.seq in self._pending and index - len(seq) < len(drafted):
            return drafted[index - len(seq)]  # overlapping copy, as LZ77: `1 1 1` continues with 1s
        return None

    # ------------------------------------------------------------ inspection

    def sequences(self) -> list[list[int]]:
        """Stored sequences, oldest first (what persisting saves)."""
        return [seq.tolist() for seq in self._seqs.values()]

    def sequence_ids(self) -> list[int]:
        return list(self._seqs)

    def continuations(self, context: Sequence[int]) -> dict[int, int]:
        """Every next token seen after exactly `context`, with its count: the level a token tree would read."""
        cursor = self._locate(list(context))
        if cursor is None:
            return {}
        if cursor.leaf is not None:
            token = self._leaf_token(cursor.leaf, cursor.leaf.start + cursor.depth, [])
            return {} if token is None else {token: 1}
        assert cursor.node is not None
        return {token: child_count(child) for token, child in cursor.node.children.items()}

    def node_count(self) -> tuple[int, int]:
        """(nodes, leaves) in the tree: for memory accounting and tests."""
        nodes, leaves, stack = 0, 0, [self.root]
        while stack:
            node = stack.pop()
            nodes += 1
            for child in node.children.values():
                if isinstance(child, Node):
                    stack.append(child)
                else:
                    leaves += 1
        return nodes, leaves
