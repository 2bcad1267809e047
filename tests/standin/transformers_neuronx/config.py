"""Stand-in of transformers_neuronx.config (1ade6d7): NeuronConfig and GenerationConfig, per imitated commit.

Same keyword-only parameters and defaults as the real classes (see neuronx_signatures.json,
"sdk_2_21_fused"), the same refusal of unknown NeuronConfig keywords; only the fields the fused
decoder and on-device generation read do anything here. The older commits' NeuronConfig takes what theirs takes:
`**kargs` from a fixed list at 7a30b42 and 0623de2 (config.py:89-110: no padding_side, `use_2d_cache_ids`, and
`lhs_aligned` from 0623de2 on), the keyword-only list of c8d6bdc (config.py:142-200, no compilation_worker_count).
ContinuousBatchingConfig: a KV cache of `batch_size_for_shared_caches` sequences that `start_ids` address as sequence
ids; it forces the 2-D (left-aligned) cache_ids layout (1ade6d7 config.py lines 272-275, 7a30b42 lines 97-99).
"""

import enum

from transformers_neuronx import _standin


class Layout(enum.Enum):
    HSB = "HSB"
    BSH = "BSH"
    SBH = "SBH"

    def __repr__(self):
        return f"Layout.{self.name}"


class ContinuousBatchingConfig:
    """1ade6d7 config.py lines 73-102: max_num_seqs, or its older name batch_size_for_shared_caches."""

    def __init__(self, **kwargs):
        self.max_num_seqs = (
            kwargs.pop("max_num_seqs")
            if kwargs.get("max_num_seqs") is not None
            else kwargs.pop("batch_size_for_shared_caches")
        )
        self.max_model_len = kwargs.pop("max_model_len") if kwargs.get("max_model_len") is not None else None
        self.optimized_paged_attention = kwargs.pop("optimized_paged_attention", None) or False
        self.enable_chunked_prefill = kwargs.pop("enable_chunked_prefill", None) or False
        assert len(kwargs) == 0, f"unexpected key word arguments: {kwargs.keys()}"

    @property
    def batch_size_for_shared_caches(self) -> int:
        return self.max_num_seqs


if _standin.COMMIT != "1ade6d7":

    class ContinuousBatchingConfig:  # noqa: F811 (7a30b42 config.py lines 49-53, the same to c8d6bdc)
        def __init__(self, batch_size_for_shared_caches):
            self.batch_size_for_shared_caches = batch_size_for_shared_caches


class GenerationConfig:
    def __init__(
        self,
        *,
        max_length=None,
        do_sample=False,
        top_k=50,
        top_p=1.0,
        top_p_min_tokens=1,
        global_top_k=None,
        eos_token_id=None,
        temperature=1.0,
        dynamic=False,
        deterministic=False,
        per_batch_line=False,
    ):
        self.max_length = max_length
        self.do_sample = do_sample
        self.per_batch_line = per_batch_line
        self.top_k = top_k
        self.top_p = float(top_p)
        self.temperature = float(temperature)
        self.top_p_min_tokens = top_p_min_tokens
        self.global_top_k = global_top_k
        self.eos_token_id = eos_token_id
        self.dynamic = dynamic
        self.deterministic = deterministic


class NeuronConfig:
    def __init__(
        self,
        *,
        sparse_attn=None,
        quant=None,
        kv_cache_quant=None,
        continuous_batching=None,
        attention_layout: Layout = Layout.HSB,
        collectives_layout: Layout = Layout.HSB,
        cache_layout: Layout = Layout.SBH,
        padding_side: str = "left",
        group_query_attention=None,
        sequence_parallel_norm: bool = False,
        sequence_parallel_norm_threshold: int = 2048,
        bf16_rms_norm: bool = False,
        on_device_embedding: bool = False,
        on_device_generation: GenerationConfig | None = None,
        all_reduce_dtype: str | None = None,
        cast_logits_dtype: str = "float32",
        fuse_qkv: bool = False,
        qkv_tiling: bool = False,
        weight_tiling: bool = False,
        mlp_in_weight_tiling_permute_order: list[int] = [1, 2, 0, 3],  # noqa: B006 (the real default)
        mlp_out_weight_tiling_permute_order: list[int] = [1, 2, 0, 3],  # noqa: B006
        log_softmax_scores: bool = False,
        shard_over_sequence: bool = False,
        output_all_logits: bool = False,
        attn_output_transposed: bool = False,
        fused_rmsnorm_qkv: bool = False,
        fused_rmsnorm_mlp: bool = False,
        mlp_out_weight_transpose: bool = False,
        fuse_mlp: bool = False,
        is_eagle_target: bool = False,
        is_eagle_draft: bool = False,
        has_pre_attention_norm: bool = True,
        compilation_worker_count: int | None = None,
        duplicate_q_weight_sos: bool = False,
        **kwargs,
    ):
        assert padding_side in ["left", "right"], (
            f"The `padding_side={padding_side}` argument must be either 'left' or 'right'"
        )
        assert len(kwargs) == 0, f"Unexpected NeuronConfig keyword arguments: {kwargs}"
        self.padding_side = padding_side
        self.on_device_embedding = on_device_embedding
        self.on_device_generation = on_device_generation
        self.continuous_batching = continuous_batching
        self.is_eagle_target = is_eagle_target
        self.is_eagle_draft = is_eagle_draft
        self.shard_over_sequence = shard_over_sequence
        self.is_sequence_parallel = False
        self.lhs_aligned = padding_side == "right"
        if continuous_batching:  # 1ade6d7 config.py lines 272-275: force left alignment (2-D cache_ids)
            self.lhs_aligned = True
            self.padding_side = "right"
        self.compilation_worker_count = compilation_worker_count

    @property
    def use_2d_cache_ids(self):
        return self.lhs_aligned

    @property
    def vectorize_last_token_id(self):
        return self.lhs_aligned


_NeuronConfig = NeuronConfig

if _standin.COMMIT in ("7a30b42", "0623de2"):
    _OLD_KEYS = {
        "all_reduce_dtype",
        "sparse_attn",
        "quant",
        "cast_logits_dtype",
        "fuse_qkv",
        "continuous_batching",
        "use_2d_cache_ids",
        "attention_layout",
        "cache_layout",
        "collectives_layout",
        "log_softmax_scores",
        "group_query_attention",
        "on_device_embedding",
        "on_device_generation",
    } | ({"lhs_aligned"} if _standin.COMMIT == "0623de2" else set())

    class NeuronConfig(_NeuronConfig):  # noqa: F811 (config.py:89-110 at 7a30b42 and 0623de2)
        def __init__(self, **kargs):
            unexpected = set(kargs) - _OLD_KEYS
            assert not unexpected, f"unexpected arguments: {unexpected}"
            aligned = bool(kargs.pop("use_2d_cache_ids", False) or kargs.pop("lhs_aligned", False))
            super().__init__(**kargs)
            self.lhs_aligned = self.lhs_aligned or aligned

elif _standin.COMMIT == "c8d6bdc":

    class NeuronConfig(_NeuronConfig):  # noqa: F811 (config.py:142-200 at c8d6bdc)
        def __init__(
            self,
            *,
            sparse_attn=None,
            quant=None,
            continuous_batching=None,
            attention_layout: Layout = Layout.HSB,
            collectives_layout: Layout = Layout.HSB,
            cache_layout: Layout = Layout.SBH,
            padding_side: str = "left",
            group_query_attention=None,
            on_device_embedding: bool = False,
            on_device_generation: GenerationConfig | None = None,
            all_reduce_dtype: str | None = None,
            cast_logits_dtype: str = "float32",
            fuse_qkv: bool = False,
            qkv_tiling: bool = False,
            weight_tiling: bool = False,
            log_softmax_scores: bool = False,
            shard_over_sequence: bool = False,
            output_all_logits: bool = False,
            attn_output_transposed: bool = False,
            **kwargs,
        ):
            aligned = bool(kwargs.pop("use_2d_cache_ids", False) or kwargs.pop("lhs_aligned", False))  # deprecated
            assert len(kwargs) == 0, f"Unexpected NeuronConfig keyword arguments: {kwargs}"
            super().__init__(
                continuous_batching=continuous_batching,
                padding_side=padding_side,
                on_device_embedding=on_device_embedding,
                on_device_generation=on_device_generation,
                shard_over_sequence=shard_over_sequence,
            )
            self.lhs_aligned = self.lhs_aligned or aligned
