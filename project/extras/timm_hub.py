"""timm backbones: ``model.backbone: timm/<name>`` (e.g. ``timm/convnext_nano.in12k_ft_in1k``).

Imported only for such a backbone. The model is built by ``timm.create_model(name,
num_classes=...)``, so its own classifier is the new head. Weights follow torchvision's policy
(``project/model/backbones.py``): a file path, then the local
Hugging Face cache, then a download, tried only when the hub answers at once. Offline with an
empty cache the run goes on from random weights, says so loudly, names the exact folder and file
to place, and records ``pretrained: false``. Nothing here waits on the network: offline,
huggingface_hub retries for about 45 s before it gives up, so a 3 s connection probe comes first.
"""

from __future__ import annotations

import difflib
import logging
import os
import pickle
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError
from torch import nn

from project.model.sources import TIMM_PREFIX, Backbone, WeightsError, is_file, is_scratch, warn_no_weights
from project.model.weights_file import load_matching, read_state_dict, strip_prefix

log = logging.getLogger(__name__)
HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm looks for, in its order
PROBE_TIMEOUT_S = 3.0
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
# what loading weights raises for a corrupt or foreign file, or no network: warned about, not fatal
LOAD_ERRORS = (OSError, RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError, SafetensorError)


def _timm():
    try:
        import timm
    except ImportError as err:
        raise WeightsError("model.backbone timm/<name> needs the timm package: "
                           "pip install 'timm>=1.0' (or pip install -e .)") from err
    return timm


def split_name(name: str) -> tuple[str, str]:
    """``timm/convnext_nano.in12k_ft_in1k`` -> (``convnext_nano``, ``in12k_ft_in1k``); an unknown
    architecture or weights tag fails with the closest names."""
    timm = _timm()
    arch, _, tag = name.removeprefix(TIMM_PREFIX).partition(".")
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=5, cutoff=0.6)
        hint = f"did you mean {', '.join(TIMM_PREFIX + c for c in close)}?" if close else "no name is close"
        raise WeightsError(f"model.backbone '{name}' is not a timm model ({hint}); list them with: "
                           f"python -m project models {arch.split('_')[0] or 'PATTERN'}")
    if tag and tag not in tags(arch):
        raise WeightsError(f"model.backbone '{name}': timm has no weights '{tag}' for {arch}; "
                           f"choose one of: {', '.join(f'{TIMM_PREFIX}{arch}.{t}' for t in tags(arch))}")
    return arch, tag


def tags(arch: str) -> list[str]:
    """The pretrained weights tags of an architecture, timm's default first."""
    timm = _timm()
    found = [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")]
    cfg = timm.models.get_pretrained_cfg(arch) if found else None
    default = cfg.tag if cfg is not None and cfg.tag in found else None
    return [default] + [t for t in found if t != default] if default else found


def pretrained_name(name: str, weights: str) -> str:
    """``arch.tag`` of the weights to use: ``DEFAULT`` is the name's tag (timm's default tag when
    the name has none); any other value is a tag of the architecture."""
    arch, tag = split_name(name)
    available = tags(arch)
    if str(weights).upper() != "DEFAULT":
        if weights not in available:
            choices = ", ".join(["DEFAULT", *available]) if available else "null"
            raise WeightsError(f"model.weights '{weights}' is neither a file nor a weights tag of {name}; "
                               f"use a path to a .safetensors/.pth file, null, or one of: {choices}")
        tag = weights
    if not (tag or available):
        raise WeightsError(f"timm has no pretrained weights for {name}: set model.weights=null to train "
                           f"from scratch, or pick one from: python -m project models {arch} --pretrained")
    return f"{arch}.{tag or available[0]}"


def preprocessing(name: str, weights: str | None) -> dict | None:
    """Input size, crop ratio, interpolation, mean and std of the weights' ``pretrained_cfg`` (a file: those
    of the name's weights); None for random weights. Reads timm's registry; builds no model."""
    if is_scratch(weights):
        return None
    if is_file(str(weights)):
        arch, tag = split_name(name)
        available = tags(arch)
        if not (tag or available):
            return None
        full = f"{arch}.{tag or available[0]}"
    else:
        full = pretrained_name(name, str(weights))
    cfg = _timm().models.get_pretrained_cfg(full)
    interpolation = cfg.interpolation if cfg.interpolation in INTERPOLATIONS else "bicubic"
    return {"size": int(cfg.input_size[-1]), "crop_ratio": float(cfg.crop_pct or 0.875),
            "interpolation": interpolation, "mean": [float(v) for v in cfg.mean],
            "std": [float(v) for v in cfg.std]}


def create(model_name: str, num_classes: int, image_size: int | None, **kwargs) -> nn.Module:
    """``timm.create_model``; models built for one input size (ViT, Swin, ...) get ``img_size``;
    the others do not accept it and are built without it."""
    timm = _timm()
    if image_size:
        try:
            return timm.create_model(model_name, num_classes=num_classes, img_size=image_size, **kwargs)
        except TypeError as err:
            if "img_size" not in str(err):
                raise
    return timm.create_model(model_name, num_classes=num_classes, **kwargs)


def head_name(net: nn.Module) -> str:
    """Qualified name of the model's classifier (``fc``, ``head.fc``, ``classifier``, ``head``)."""
    classifier = net.get_classifier()
    if isinstance(classifier, tuple | list):  # distilled models: the main head
        classifier = classifier[0]
    found = next((n for n, m in net.named_modules() if m is classifier and n), None)
    if found is None or not list(classifier.parameters()):
        raise WeightsError(f"cannot find the classification layer of {type(net).__name__} "
                           "(get_classifier() returned no layer with parameters)")
    return found


def build(name: str, weights: str | None, num_classes: int, image_size: int | None = None) -> Backbone:
    """The timm model ``name`` with ``weights`` and a new ``num_classes`` head."""
    arch, tag = split_name(name)
    if is_scratch(weights):
        net = create(f"{arch}.{tag}" if tag else arch, num_classes, image_size)
        return Backbone(net, head_name(net), False, "random init (weights: null)")
    if is_file(str(weights)):
        net, note = _load_file(name, arch, Path(str(weights)).expanduser(), num_classes, image_size)
        return Backbone(net, head_name(net), True, note)
    full = pretrained_name(name, str(weights))
    cfg = _timm().models.get_pretrained_cfg(full)
    cached = find_cached(cfg)
    if cached is not None:
        try:
            overlay = {"file": str(cached)}
            net = _pretrained(full, cfg, num_classes, image_size, pretrained_cfg_overlay=overlay)
            return Backbone(net, head_name(net), True, f"pretrained {full} from the cache ({cached})")
        except LOAD_ERRORS as err:  # a corrupt or foreign file: never fatal, always loud
            reason = f"the cached file {cached} does not load ({type(err).__name__}: {err}); replace it"
    elif hub_offline():
        reason = "HF_HUB_OFFLINE is set and the file is not in the local cache"
    elif not reachable(hub_endpoint() if cfg.hf_hub_id else cfg.url or ""):
        reason = f"{hub_endpoint() if cfg.hf_hub_id else cfg.url} is not reachable (offline?)"
    else:
        cache = {"cache_dir": str(hub_cache_dir())} if cfg.hf_hub_id else {}
        try:
            net = _pretrained(full, cfg, num_classes, image_size, **cache)
            return Backbone(net, head_name(net), True, f"pretrained {full} from a download")
        except LOAD_ERRORS as err:  # offline, proxy, missing file: never fatal, always loud
            reason = f"{type(err).__name__}: {err}"
    expected = expected_file(cfg)
    if cfg.hf_hub_id:
        how = (f"any folder name in place of <any>; `hf download {cfg.hf_hub_id}` on a machine with\n"
               f"!!   network access fills that cache: copy its {expected.parents[2].name} folder, "
               "or set HF_HOME")
    else:  # weights with a URL only: the torch hub cache
        how = f"download {cfg.url} on a machine with network access, or set TORCH_HOME"
    warn_no_weights(f"timm/{full}", reason, expected, how)
    net = create(full, num_classes, image_size)
    state = "does not load: replace it" if expected.is_file() else "not found"
    return Backbone(net, head_name(net), False, f"NO pretrained weights: {expected} {state}")


def _pretrained(full: str, cfg, num_classes: int, image_size: int | None, **kwargs) -> nn.Module:
    """timm's own loading (its checkpoint filter resamples a ViT's position embedding to
    ``image_size``); the ImageNet head is dropped, so the head is always new."""
    net = create(full, num_classes, image_size, pretrained=True, **kwargs)
    if num_classes == cfg.num_classes:  # timm kept the pretrained classifier: start a new one
        net.reset_classifier(num_classes)
    return net


def _load_file(name: str, arch: str, path: Path, num_classes: int, image_size: int | None
               ) -> tuple[nn.Module, str]:
    """A timm state dict, a timm training checkpoint, or a checkpoint of this template (any
    classes): everything but the head must fit; the head is new."""
    state = read_state_dict(path)
    net = create(arch, num_classes, image_size)
    state = _model_filter(strip_prefix(state, net.state_dict()), net)
    head = head_name(net)
    head_keys = sorted(k for k in state if k.startswith(f"{head}."))
    note = load_matching(net, {k: v for k, v in state.items() if k not in head_keys}, name, path, head)
    if head_keys:
        note += f"; dropped the file's head {', '.join(head_keys)} (a new {head} is trained)"
    return net, note


def _model_filter(state: dict, net: nn.Module) -> dict:
    """The model module's ``checkpoint_filter_fn`` (timm's convention): resamples position
    embeddings to this input size and converts original-repo layouts; as is when there is none."""
    filter_fn = getattr(sys.modules.get(type(net).__module__), "checkpoint_filter_fn", None)
    if filter_fn is None:
        return state
    try:
        return filter_fn(dict(state), net)
    except (KeyError, IndexError, AttributeError, RuntimeError, ValueError) as err:
        # a filter written for another layout: the key check of load_matching still applies
        log.debug("checkpoint_filter_fn of %s skipped: %s", type(net).__name__, err)
        return state


# -- the Hugging Face cache, read without the network ------------------------------------------
def hub_cache_dir() -> Path:
    """The hub cache as huggingface_hub resolves it, read from the environment now (its own
    constant is fixed at import, before a test or a user sets HF_HOME)."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def _hub_files(cfg) -> tuple[str, str | None, list[str]]:
    """(repo id, revision, file names to look for), as timm downloads them."""
    repo, _, revision = cfg.hf_hub_id.partition("@")
    if cfg.hf_hub_filename:
        safe = cfg.hf_hub_filename.replace("pytorch_model.bin", "model.safetensors")
        return repo, revision or None, list(dict.fromkeys([safe, cfg.hf_hub_filename]))
    return repo, revision or None, list(HUB_FILES)


def find_cached(cfg) -> Path | None:
    """The weights file in the local cache: the hub cache (``refs/main`` -> snapshot, or any
    snapshot holding the file), or the torch hub cache for weights that only have a URL."""
    if not cfg.hf_hub_id:
        path = expected_file(cfg)
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    repo, revision, files = _hub_files(cfg)
    cache = hub_cache_dir()
    for file in files:
        hit = try_to_load_from_cache(repo, file, cache_dir=cache, revision=revision)
        if isinstance(hit, str):
            return Path(hit)
    snapshots = cache / f"models--{repo.replace('/', '--')}" / "snapshots"
    return next((p for file in files for p in sorted(snapshots.glob(f"*/{file}")) if p.is_file()), None)


def expected_file(cfg) -> Path:
    """Where a copied weights file is found: ``<cache>/models--org--repo/snapshots/<any>/file``."""
    if not cfg.hf_hub_id:
        return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(cfg.url).path).name
    repo, _, files = _hub_files(cfg)
    return hub_cache_dir() / f"models--{repo.replace('/', '--')}" / "snapshots" / "<any>" / files[0]


def reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``url``'s host (or the HTTPS proxy) opens within ``timeout``."""
    proxy = next((os.environ[k] for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
                  if os.environ.get(k)), None)
    if proxy and "://" not in proxy:
        proxy = f"http://{proxy}"
    target = urlparse(proxy or url)
    if not target.hostname:
        return False
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True
