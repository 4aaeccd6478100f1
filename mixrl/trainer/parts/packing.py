"""Padding-free rows: the rows of a forward packed into one sequence (``trainer.padding_free``).

TRL's per-token log-probs run the model on ``[rows, prompt + completion]`` with prompts
left-padded and completions right-padded to the longest in the chunk, so a batch with a long
tail of lengths spends most of its forward and backward on padding. Here the real tokens of
every row (``attention_mask == 1``) are concatenated into one sequence (under flash attention;
with a mask-based attention, sequences of at most the padded width, so that the ``[W, W]`` mask
never exceeds the padded chunk's: :meth:`Packing.capacity`), with
position ids restarting at 0 on each row; transformers builds the attention from the position
ids when no attention mask is given (``transformers.masking_utils.find_packed_sequence_indices``:
a block-diagonal causal mask for SDPA / eager / flex attention on CPU, flash-attention's
variable-length kernel from ``cu_seq_lens`` under ``flash_attention_2``), so no token attends
across rows. The fused LM head (``trl.trainer.utils.add_fused_lm_head``) is handed pre-shifted
labels (``shift_labels``): the next token of the same row where it is a scored (completion)
token, ``-100`` elsewhere, so a row's last token never scores the next row's first. The
per-token log-probs and entropies come back scattered into the ``[rows, completion width]``
layout the losses read (0 on padding, as the padded forward's masked head returns), so no loss
changes. Rows with no scored token (entirely prompt, empty completions) are left out of the
packed sequence: their values are 0 either way. The same packing serves the policy's loss
forward, the old policy's and the reference model's log-probs, the teachers' scoring (all
through TRL's ``_get_per_token_logps_and_entropies``) and the critic's values.

Equal to the padded forward: rotary position embeddings depend only on the distance between
two tokens, so a row's positions starting at 0 (packed) or after its left padding (TRL's padded
forward numbers positions from the first column) give the same attention up to float rounding;
measured within 1e-5 (float32) on per-token log-probs, losses and gradients of every algorithm
family (``tests/test_padding_free.py``). Not equal, hence the padded forward, for: a model whose
attention is not built by transformers' masking utilities (custom code, encoder-decoders),
absolute position embeddings (GPT-2's learned positions see the left padding), an attention
implementation outside :data:`ATTENTIONS`, a row whose attention mask has a hole inside it
(the padded forward runs the hidden token as a query), multimodal inputs and MoE auxiliary
losses. ``true`` refuses such a model with one line; ``auto`` (the default) keeps the padded
forward for it and says why once.

Idea: verl's ``use_remove_padding`` (verl/workers/actor/dp_actor.py: ``unpad_input`` /
``pad_input`` around one variable-length forward); TRL packs only in SFT (``padding_free``).

Owns: the mode, the reasons already said. Receives per call: the model, the rows. Returns
tensors. No state to checkpoint (``state_dict() == {}``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mixrl.errors import ConfigError

MODES = ("auto", "true", "false")
#: attention implementations that build a packed-rows mask from position ids (transformers 5)
ATTENTIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
#: functions of transformers.masking_utils that honour packed position ids
_MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask", "create_masks_for_generate")
#: position-embedding types that see absolute positions (padded and packed rows would differ)
_ABSOLUTE = ("absolute", "learned")


def resolve_mode(value) -> str:
    """``trainer.padding_free`` as one of :data:`MODES` (YAML booleans accepted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip().lower()
    if text in ("1", "yes", "on"):
        return "true"
    if text in ("0", "no", "off", "none", "null"):
        return "false"
    return text


def _base_model(model):
    """The transformers model under DDP / FSDP / PEFT wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        else:
            break
    return model


def unsupported_class(model_class, config) -> str | None:
    """Why a model of ``model_class`` with ``config`` cannot take packed rows, or None.
    Reads code and config only (no weights): usable before the model loads."""
    if getattr(config, "is_encoder_decoder", False):
        return f"{config.model_type} is an encoder-decoder model"
    impl = getattr(config, "_attn_implementation", None) or "sdpa"
    if impl not in ATTENTIONS:
        return f"attention implementation '{impl}' does not take packed rows (padding-free needs one of {', '.join(ATTENTIONS)})"
    if str(getattr(config, "position_embedding_type", "rope")) in _ABSOLUTE or getattr(config, "n_positions", None):
        return f"{config.model_type} has absolute position embeddings (packed rows would see other positions than padded ones)"
    sources = []
    for klass in inspect.getmro(model_class):
        if klass.__module__.startswith("transformers.models") or klass.__module__.startswith("transformers_modules"):
            try:
                sources.append(inspect.getsource(inspect.getmodule(klass)))
            except (OSError, TypeError):
                pass
            break
    if not any(name in src for src in sources for name in _MASK_BUILDERS):
        return (f"{model_class.__name__} does not build its attention mask with transformers' masking utilities "
                "(no packed-rows mask from position ids)")
    return None


def unsupported(model) -> str | None:
    """Why ``model`` (wrapped or not) cannot take packed rows, or None."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    if config is None:
        return f"{type(base).__name__} has no transformers config"
    return unsupported_class(type(base), config)


def refusal(why: str) -> str:
    """The one line that refuses ``trainer.padding_free=true`` for a model, naming the fix."""
    return f"trainer.padding_free=true: {why}; set trainer.padding_free=auto (padded forwards for this model) or false"


@dataclass
class Packed:
    """One chunk of rows packed into ``[K, W]`` sequences (``K = 1`` unless a capacity splits them)."""

    input_ids: torch.Tensor  # [K, W]
    position_ids: torch.Tensor  # [K, W], 0 at each row's first token (and at each sequence's filler)
    shift_labels: torch.Tensor  # [K, W]: the next token of the same row where it is scored, else -100
    rows: torch.Tensor  # [S]: the row of each scored token
    cols: torch.Tensor  # [S]: its completion column
    at: torch.Tensor  # [S]: the flat index (into K * W) whose output scores it (the token before it)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
         capacity: int | None = None) -> Packed | None:
    """Pack the real tokens of ``[B, L]`` rows (the last ``logits_to_keep`` columns scored, as in
    TRL's padded forward) into one sequence, or, with ``capacity``, into sequences of at most that
    many tokens (first-fit by decreasing length; a sequence's unused tail is filler with positions
    restarting at 0 and nothing scored). None when the padded forward must be kept: a row's
    attention mask is not one run of ones (a hole: the padded forward runs the hidden token as
    a query), or no row has a scored token (the padded forward keeps the loss connected to the model)."""
    B, L = input_ids.shape
    C = int(logits_to_keep)
    dev = input_ids.device
    m = attention_mask.bool()
    runs = m[:, 0].long() + (m[:, 1:] & ~m[:, :-1]).sum(1)
    if bool((runs > 1).any()):
        return None
    keep = m[:, L - C:].any(1)  # rows with no scored token contribute 0 either way
    if not bool(keep.any()):
        return None
    sel = m & keep.unsqueeze(1)
    ids = input_ids[sel]  # the kept rows' tokens, row after row
    positions = (m.long().cumsum(1) - 1)[sel]
    rows = torch.arange(B, device=dev).unsqueeze(1).expand(B, L)[sel]
    cols = torch.arange(L, device=dev).unsqueeze(0).expand(B, L)[sel]
    # token k+1 is scored at k when it is a completion token of the same row
    scored_next = torch.zeros(ids.numel(), dtype=torch.bool, device=dev)
    scored_next[:-1] = (rows[1:] == rows[:-1]) & (cols[1:] >= L - C)
    shift = torch.full_like(ids, -100)
    shift[:-1] = torch.where(scored_next[:-1], ids[1:], shift[:-1])
    at = torch.nonzero(scored_next).squeeze(1)
    # sequences: each row goes whole into the first with room (longest rows first)
    lengths = sel.sum(1).tolist()
    cap = max(max(lengths), int(capacity)) if capacity else sum(lengths)
    fill: list[int] = []
    where = [(0, 0)] * B  # (sequence, offset) of each kept row
    for r in sorted((r for r in range(B) if lengths[r]), key=lambda r: -lengths[r]):
        k = next((k for k, f in enumerate(fill) if f + lengths[r] <= cap), None)
        if k is None:
            k = len(fill)
            fill.append(0)
        where[r] = (k, fill[k])
        fill[k] += lengths[r]
    K, W = len(fill), max(fill)
    start = torch.tensor([k * W + o for k, o in where], dtype=torch.long, device=dev)
    target = start[rows] + positions  # each token's flat index in [K * W]
    flat_pos = torch.arange(W, device=dev).repeat(K) - torch.tensor(fill, device=dev).repeat_interleave(W)
    out_ids = torch.full((K * W,), int(ids[0]), dtype=ids.dtype, device=dev)  # filler: any token, never scored
    out_pos = flat_pos.clamp(min=0)  # filler restarts at 0: a sequence of its own
    out_shift = torch.full((K * W,), -100, dtype=shift.dtype, device=dev)
    out_ids[target], out_pos[target], out_shift[target] = ids, positions, shift
    return Packed(out_ids.view(K, W), out_pos.view(K, W), out_shift.view(K, W), rows[at + 1], cols[at + 1] - (L - C),
                  target[at])


def unpack(values: torch.Tensor, packed: Packed, shape: tuple[int, int]) -> torch.Tensor:
    """``values`` [K, W] (one per packed token, each scoring the next) into ``shape`` = [B, C], 0 where unscored."""
    out = values.new_zeros(shape)
    return out.index_put((packed.rows, packed.cols), values.reshape(-1)[packed.at])


class Packing:
    """Padding-free forwards for ``trainer.padding_free`` (``auto`` | ``true`` | ``false``).

    Args:
        mode: :data:`MODES`.
        say: ``text -> None``: where ``auto`` says once per model why it keeps the padded forward.
    """

    def __init__(self, mode: str, *, say: Callable[[str], None] = print):
        self.mode = resolve_mode(mode)
        if self.mode not in MODES:
            raise ValueError(f"trainer.padding_free={mode!r}; use auto, true or false")
        self.say = say
        self._verdicts: dict[int, str | None] = {}

    def reason(self, model) -> str | None:
        """Why ``model``'s forwards stay padded (None: packed). Decided once per model."""
        if self.mode == "false":
            return "trainer.padding_free=false"
        key = id(model)
        if key not in self._verdicts:
            why = unsupported(model)
            if why is not None and self.mode == "true":
                raise ConfigError(refusal(why))
            if why is not None:
                self.say(f"padding-free rows off for {type(_base_model(model)).__name__}: {why} (padded forwards)")
            self._verdicts[key] = why
        return self._verdicts[key]

    def applies(self, model) -> bool:
        return self.reason(model) is None

    @staticmethod
    def capacity(model, width: int) -> int | None:
        """Tokens per packed sequence: all in one under flash attention (variable-length kernel,
        no mask); else at most the padded width, so the ``[W, W]`` mask that SDPA / eager / flex
        build over a sequence never holds more than the padded chunk's masks did."""
        impl = getattr(getattr(_base_model(model), "config", None), "_attn_implementation", None) or "sdpa"
        return None if impl.startswith("flash_attention") else int(width)

    def logps(self, model, input_ids, attention_mask, logits_to_keep, *, batch_size=None, compute_entropy=False,
              autocast: Callable = None, padded: Callable = None):
        """TRL's ``_get_per_token_logps_and_entropies`` on packed rows: ``(logps [B, C], entropies
        [B, C] or None, None)``. A chunk that cannot be packed (:func:`pack` returns None) goes to
        ``padded(input_ids, attention_mask)`` (TRL's own, for those rows)."""
        autocast = autocast or contextlib.nullcontext
        B, C = input_ids.size(0), int(logits_to_keep)
        batch_size = batch_size or B
        all_logps, all_entropies = [], []
        for start in range(0, B, batch_size):
            ids, att = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
            p = pack(ids, att, C, capacity=self.capacity(model, ids.size(1)))
            if p is None:
                lp, ent, _ = padded(ids, att)
            else:
                with autocast():
                    out = model(input_ids=p.input_ids, position_ids=p.position_ids, shift_labels=p.shift_labels,
                                fused_lm_head=True, use_cache=False)
                lp = unpack(out.log_probs, p, (ids.size(0), C))
                ent = unpack(out.entropy, p, (ids.size(0), C)) if compute_entropy else None
            all_logps.append(lp)
            all_entropies.append(ent)
        logps = torch.cat(all_logps, dim=0)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        return logps, entropies, None

    def values(self, backbone, head, input_ids, attention_mask, width: int) -> torch.Tensor | None:
        """The critic's value before each of the last ``width`` tokens, [B, width] (float32), on
        packed rows; None when the rows cannot be packed (the caller runs its padded forward)."""
        p = pack(input_ids, attention_mask, width, capacity=self.capacity(backbone, input_ids.size(1)))
        if p is None:
            return None
        # no cache: transformers reads packed rows from the position ids only without one
        h = backbone(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False).last_hidden_state
        v = head(h.to(head.weight.dtype)).squeeze(-1).float()
        return unpack(v, p, (input_ids.size(0), int(width)))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
