"""An EAGLE-3 head as a torch module: one definition of its arithmetic, for training and for drafting.

The head (SafeAILab/EAGLE cb7e0841 `eagle/traineagle3/cnets.py`: `Model.forward` 733-868 and
`LlamaDecoderLayeremb.forward` 386-444; SpecForge a6b6b023 `specforge/modeling/draft/llama3_eagle.py:1570-1777`):
- `fuse`: fc maps the target's three taps, concatenated (3 x target hidden), to the head's width H;
- `layer`: one Llama decoder layer whose attention reads [input_layernorm(embedding(token)); hidden_norm(hidden)]
  (2H wide), with the residual taken from `hidden` before its norm; then the usual MLP block;
- `logits`: lm_head(norm(hidden)) over the draft vocabulary (`target_ids` maps draft ids to the target's).

Position p of a sequence pairs the target's hidden state at p with the token at p + 1 and predicts the token at
p + 2 (SafeAILab shifts input_ids and the targets left by one, `cnets.py:723-724`; the rope position is p).
A drafted chain continues from the head's own output: its step s sits at position p + s.

Two ways to run `layer`, the same arithmetic with different keys:
- `forward` (training, the whole sequence at once): step 0 attends causally over the sequence; with `steps` (the
  keys and values of earlier steps, as returned) it is SafeAILab's training-time test step i: the query at p also
  sees the keys of steps 1..i at p (`cnets.py:280-305`), at rope position p + i (`cnets.py:253-256`).
- `decode` (drafting): rows at (slot, position) of a `HeadCache`; writes their keys and values there and attends
  to the slot's positions up to each row's own, so a rejected chain is rolled back by overwriting it. Step s of a
  chain drafted from position p attends to exactly the keys training step s saw at p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own spelling)
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from neuron_ssp.drafters.eagle_checkpoint import EagleCheckpoint
from neuron_ssp.topology.head_config import EagleConfig

Span = tuple[int, int, int]  # rows of one slot in a decode call: (slot, first position, count)
StepCache = list[tuple[torch.Tensor, torch.Tensor]]  # training: each earlier step's (keys, values)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class HeadCache:
    """The head's keys and values for `slots` sequences of `n_positions`: (slots, kv_heads, n_positions, head_dim)."""

    def __init__(self, config: EagleConfig, slots: int, n_positions: int, device: torch.device | str = "cpu"):
        shape = (slots, config.num_key_value_heads, n_positions, config.head_dim)
        self.keys = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.n_positions = n_positions


class EagleHead(torch.nn.Module):
    """The head in fp32. `embedding`: the target's token embedding (V x H), shared and frozen; a checkpoint's own
    `embed_tokens.weight` is used where it carries one."""

    embed: torch.Tensor  # buffers, registered in __init__
    target_ids: torch.Tensor

    def __init__(self, config: EagleConfig, embedding: torch.Tensor):
        super().__init__()
        self.config = config
        h, hd = config.hidden_size, config.head_dim
        heads, kv = config.num_attention_heads, config.num_key_value_heads

        def linear(rows: int, cols: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(rows, cols).normal_(0, 0.02))

        def norm() -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.ones(h))

        self.fc = linear(h, 3 * config.target_hidden_size)
        self.hidden_norm, self.input_norm, self.post_norm, self.norm = norm(), norm(), norm(), norm()
        self.q, self.k, self.v = linear(heads * hd, 2 * h), linear(kv * hd, 2 * h), linear(kv * hd, 2 * h)
        self.o = linear(h, heads * hd)
        self.gate, self.up, self.down = (
            linear(config.intermediate_size, h),
            linear(config.intermediate_size, h),
            linear(h, config.intermediate_size),
        )
        self.lm_head = linear(config.draft_vocab_size, h)
        self.register_buffer("embed", embedding.detach().float(), persistent=False)
        self.register_buffer("target_ids", torch.arange(config.draft_vocab_size), persistent=False)
        self.rotary = LlamaRotaryEmbedding(config=LlamaConfig(**config.raw | {"head_dim": hd}))

    # names of the checkpoint's tensors, in the order of this module's parameters
    NAMES = {
        "fc": "fc.weight",
        "hidden_norm": "midlayer.hidden_norm.weight",
        "input_norm": "midlayer.input_layernorm.weight",
        "post_norm": "midlayer.post_attention_layernorm.weight",
        "norm": "norm.weight",
        "q": "midlayer.self_attn.q_proj.weight",
        "k": "midlayer.self_attn.k_proj.weight",
        "v": "midlayer.self_attn.v_proj.weight",
        "o": "midlayer.self_attn.o_proj.weight",
        "gate": "midlayer.mlp.gate_proj.weight",
        "up": "midlayer.mlp.up_proj.weight",
        "down": "midlayer.mlp.down_proj.weight",
        "lm_head": "lm_head.weight",
    }

    @classmethod
    def from_checkpoint(cls, checkpoint: EagleCheckpoint, embedding: torch.Tensor | None = None) -> EagleHead:
        """The head of a checkpoint (eagle_checkpoint.read_checkpoint), with the target's `embedding` unless the
        checkpoint carries its own."""
        own = checkpoint.tensors.get("embed_tokens.weight")
        if own is None and embedding is None:
            raise ValueError("the checkpoint has no embed_tokens.weight: pass the target's embedding")
        head = cls(checkpoint.config, own if own is not None else embedding)  # type: ignore[arg-type]
        with torch.no_grad():
            for attribute, name in cls.NAMES.items():
                getattr(head, attribute).copy_(checkpoint.tensors[name].float())
        head.target_ids.copy_(checkpoint.target_ids)
        return head

    def to_checkpoint(self, d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None) -> EagleCheckpoint:
        """This head's tensors under the checkpoint's names (d2t / t2d: eagle_checkpoint.vocab_maps), for
        eagle_checkpoint.write_checkpoint. The embedding is the target's and is not included."""
        tensors = {name: getattr(self, attribute).detach().clone() for attribute, name in self.NAMES.items()}
        if d2t is not None and t2d is not None:
            tensors.update(d2t=d2t, t2d=t2d)
        return EagleCheckpoint(self.config, tensors)

    # ------------------------------------------------------------ the arithmetic

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """The three taps concatenated (..., 3 x target hidden) -> the head's hidden input (..., H)."""
        return taps.float() @ self.fc.T

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the head's output (..., H) -> (..., draft_vocab)."""
        return self._norm(hidden, self.norm) @ self.lm_head.T

    def layer(
        self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """The decoder layer over rows (..., H) of `hidden` paired with `tokens` (...) at rope `positions` (...);
        `attend(q, k, v)` (heads / kv heads x head_dim per row, rotated) returns the attention output per row."""
        config = self.config
        lead = hidden.shape[:-1]
        embedded = F.embedding(tokens.to(self.embed.device), self.embed)
        x = torch.cat([self._norm(embedded, self.input_norm), self._norm(hidden, self.hidden_norm)], -1)
        q = (x @ self.q.T).view(*lead, config.num_attention_heads, config.head_dim)
        k = (x @ self.k.T).view(*lead, config.num_key_value_heads, config.head_dim)
        v = (x @ self.v.T).view(*lead, config.num_key_value_heads, config.head_dim)
        cos, sin = self.rotary(x, positions.reshape(1, -1))
        cos, sin = cos.view(*lead, 1, config.head_dim), sin.view(*lead, 1, config.head_dim)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        hidden = hidden + attend(q, k, v).reshape(*lead, -1) @ self.o.T
        mlp_in = self._norm(hidden, self.post_norm)
        return hidden + (F.silu(mlp_in @ self.gate.T) * (mlp_in @ self.up.T)) @ self.down.T

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, weight.shape, weight, self.config.rms_norm_eps)

    # ------------------------------------------------------------ training: the whole sequence

    def forward(
        self, hidden: torch.Tensor, tokens: torch.Tensor, steps: StepCache | None = None
    ) -> tuple[torch.Tensor, StepCache]:
        """One training-time-test step over batches of whole sequences from position 0: `hidden` (B, T, H) (step 0:
        `fuse(taps)`; step i: step i-1's output), `tokens` (B, T) the token paired with each position (step i: the
        token at p + 1 + i). Returns the step's output (B, T, H) (`logits` of it predict the token at p + 2 + i)
        and `steps` with this step's keys and values appended, for the next step."""
        steps = list(steps or [])
        length = hidden.shape[1]
        positions = torch.arange(length, device=hidden.device).expand(hidden.shape[0], length) + len(steps)
        mask = _training_mask(length, len(steps), hidden.device)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            steps.append((k, v))
            keys = torch.cat([key for key, _ in steps], 1).transpose(1, 2)
            values = torch.cat([value for _, value in steps], 1).transpose(1, 2)
            return _attention(q.transpose(1, 2), keys, values, mask).transpose(1, 2)

        return self.layer(hidden, tokens, positions, attend), steps

    # ------------------------------------------------------------ drafting: rows of cache slots

    def decode(
        self, hidden: torch.Tensor, tokens: torch.Tensor, spans: Sequence[Span], cache: HeadCache
    ) -> torch.Tensor:
        """Rows (n, H) paired with `tokens` (n,), segment after segment as `spans` says: each writes its keys and
        values at its slot's positions and attends to that slot's positions up to its own. Returns (n, H)."""
        positions = torch.cat([torch.arange(start, start + count) for _, start, count in spans]).to(hidden.device)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            parts, begin = [], 0
            for slot, start, count in spans:
                end = start + count
                cache.keys[slot, :, start:end] = k[begin : begin + count].transpose(0, 1)
                cache.values[slot, :, start:end] = v[begin : begin + count].transpose(0, 1)
                mask = torch.arange(end, device=q.device) <= torch.arange(start, end, device=q.device).unsqueeze(1)
                rows = q[begin : begin + count].transpose(0, 1).unsqueeze(0)
                out = _attention(
                    rows, cache.keys[slot : slot + 1, :, :end], cache.values[slot : slot + 1, :, :end], mask
                )
                parts.append(out[0].transpose(0, 1))
                begin += count
            return torch.cat(parts)

        return self.layer(hidden, tokens, positions, attend)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face Llama's apply_rotary_pos_emb: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, heads, n, hd) queries over (B, kv_heads, L, hd) keys and values where `mask` (n, L) is True."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=q.shape[1] != keys.shape[1])


def _training_mask(length: int, earlier_steps: int, device: torch.device) -> torch.Tensor:
    """Step 0's keys causally, each later step's key at the query's own position only (SafeAILab's diagonal)."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * earlier_steps, 1)
