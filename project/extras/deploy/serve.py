"""Serve a model over HTTP with LitServe: the newest run's best checkpoint, or an exported ONNX file.

    python -m project serve [--ckpt_path best|last|PATH | --onnx model.onnx] [--port 8000]
                            [--max_batch_size 8 --batch_timeout 0.01] [--min_confidence 0.9]

``POST /predict``: the image as multipart field ``file`` (several allowed), or its bytes as the
body (``Content-Type: image/...``). The answer is ``{"predictions": [row, ...]}``, one row per
image with ``predict``'s CSV columns (the same calibrated probabilities, to the digit) and
``unsure``: true below ``--min_confidence``, where ``predicted`` is ``unsure``. ``GET /`` is a
page to try it (``page.html``: drop images, see the top classes, and for a checkpoint the
Grad-CAM heat map of the top class); ``GET /health`` and ``GET /info`` (classes, preprocessing,
model file and its SHA-256, temperature). A bad upload is a 4xx with a one-line ``detail``; the
server keeps answering.
"""

from __future__ import annotations

import argparse
import base64
import errno
import hashlib
import io
import json
import signal
import socket
import warnings
from pathlib import Path

import litserve as ls
import numpy as np
from PIL import Image

from project.common.options import accelerator, positive_int
from project.common.pixels import DECODE_ERRORS
from project.errors import ProjectError
from project.tasks import answers

RAW_TYPES = ("image/", "application/octet-stream")


def http_error(status: int, detail: str):
    from fastapi import HTTPException

    return HTTPException(status_code=status, detail=detail)


def check_image(data: bytes, name: str) -> None:
    """A one-line 4xx for what is not an image we should decode: empty, unreadable, too many pixels."""
    if not data:
        raise http_error(400, f"'{name}' is empty")
    try:
        with Image.open(io.BytesIO(data)) as img:
            pixels = img.size[0] * img.size[1]
    except DECODE_ERRORS as err:
        raise http_error(415, f"'{name}' is not an image ({type(err).__name__})") from None
    if Image.MAX_IMAGE_PIXELS and pixels > Image.MAX_IMAGE_PIXELS:
        raise http_error(413, f"'{name}' has {pixels / 1e6:.0f} megapixels, above Pillow's "
                              f"decompression-bomb limit of {Image.MAX_IMAGE_PIXELS / 1e6:.0f}")


class RawBody:
    """ASGI middleware: a ``POST`` whose body is the image itself becomes JSON for LitServe (which
    reads forms and JSON only); any other content type is a 415 naming the two ways to send one."""

    def __init__(self, app, path: str = "/predict") -> None:
        self.app, self.path = app, path

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        kind = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if kind.startswith("multipart/form-data") or kind == "application/json":
            return await self.app(scope, receive, send)
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse

        if not kind.startswith(RAW_TYPES):
            detail = (f"content type '{kind or 'none'}': send the image as multipart field 'file' or as "
                      "the body with an image/* content type")
            return await JSONResponse({"detail": detail}, status_code=415)(scope, receive, send)
        body, more = b"", True
        try:
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
        except HTTPException as err:  # LitServe's size limit, raised while the body arrives
            reply = JSONResponse({"detail": err.detail}, status_code=err.status_code)
            return await reply(scope, receive, send)
        payload = json.dumps({"raw": base64.b64encode(body).decode()}).encode()
        scope = {**scope, "headers": [(k, v) for k, v in scope["headers"]
                                      if k not in (b"content-type", b"content-length")]
                 + [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]}
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}

        await self.app(scope, replay, send)


def wants_cam(request) -> bool:
    """The page's form asks for the heat map with a field ``cam=1``."""
    return not isinstance(request, dict) and request.get("cam") == "1"


def uploads(request) -> list[tuple[str, bytes]]:
    """(name, bytes) of each uploaded image: form fields ``file``, or the raw body."""
    if isinstance(request, dict):
        if "raw" not in request:
            raise http_error(400, "no image: send multipart field 'file' or the image as the body")
        return [("body", base64.b64decode(request["raw"]))]
    files = request.getlist("file")
    if not files:
        raise http_error(400, "no 'file' field in the form")
    out = []
    for f in files:
        if isinstance(f, str):
            raise http_error(400, "the 'file' field holds text, not a file")
        out.append((f.filename or "file", f.file.read()))
    return out


class ClassifierAPI(ls.LitAPI):
    """The checkpoint through ``predict``'s own functions, or the ONNX file through ``infer.py``'s:
    each image's row is the one those commands write. Module-level: LitServe's workers unpickle it."""

    def __init__(self, ckpt: Path | None, onnx: Path | None, top_k: int = 3,
                 min_confidence: str | None = None, max_batch_size: int = 1,
                 batch_timeout: float = 0.0) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt, self.onnx_path, self.top_k, self.min_confidence = ckpt, onnx, top_k, min_confidence

    def setup(self, device: str) -> None:
        if self.onnx_path is not None:
            from project.extras.deploy.infer import OnnxClassifier

            self.onnx = OnnxClassifier(self.onnx_path)
            self.answers = self.onnx.answers
        else:
            from project.checkpoints import load_model

            self.model = load_model(self.ckpt).to(device)
            self.device = device
            self.answers = answers.answers(self.model.class_names, self.model.answer_state())

    def decode_request(self, request) -> tuple[list[tuple[str, object]], bool]:
        """Each upload checked and decoded here, per request: a bad one fails its own request only.
        With the heat map asked for: (the images, True)."""
        from project.data.images import decode, needed_side

        decoded = []
        for name, data in uploads(request):
            check_image(data, name)
            try:
                if self.onnx_path is not None:
                    decoded.append((name, self.onnx.read(io.BytesIO(data))))
                else:
                    decoded.append((name, decode(data, needed_side(self.model.preprocessing))))
            except DECODE_ERRORS as err:  # a readable header over broken pixels (truncated)
                raise http_error(415, f"'{name}' could not be decoded ({type(err).__name__})") from None
        return decoded, wants_cam(request) and self.onnx_path is None

    def batch(self, inputs: list) -> list:
        return inputs  # requests of one or several images each: predict runs them as one batch

    def unbatch(self, output: list) -> list:
        return output

    def predict(self, requests):
        requests = requests if self.max_batch_size > 1 else [requests]
        flat = [(name, image, cam) for files, cam in requests for name, image in files]
        images = [image for _, image, _ in flat]
        logits = (self.onnx.logits(images) if self.onnx_path is not None
                  else torch_logits(self.model, images, self.device))
        scores = self.answers.scores(logits)
        rows = self.answers.rows_from_scores([name for name, _, _ in flat], scores, self.top_k,
                                             self.min_confidence)
        for row, (_, image, cam), s in zip(rows, flat, scores, strict=True):
            explained = self.answers.explained(s) if cam else None  # None: no class to explain
            if explained is not None:  # the top class's Grad-CAM, for the page
                row["cam"] = grad_cam_png(self.model, image, explained, self.device)
        out, start = [], 0
        for files, _ in requests:
            out.append(rows[start:start + len(files)])
            start += len(files)
        return out if self.max_batch_size > 1 else out[0]

    def encode_response(self, rows: list[dict]) -> dict:
        return {"predictions": rows}


def torch_logits(model, images: list, device: str) -> np.ndarray:
    """``predict``'s raw outputs: the evaluation transform of each decoded image, float32, eval mode."""
    import torch

    from project.data.transforms import eval_transforms

    transform = eval_transforms(model.preprocessing)
    x = torch.stack([transform(image) for image in images]).to(device)
    with torch.inference_mode():
        return model(x).float().cpu().double().numpy()


def grad_cam_png(model, image, class_index: int, device: str) -> str | None:
    """The Grad-CAM heat map (pytorch-grad-cam) of ``class_index`` over the model's input view
    of ``image``, as a base64 PNG; None for a backbone without a convolution to look at."""
    import torch
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.image import show_cam_on_image
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from project.data.transforms import eval_transforms

    convs = [m for m in model.net.modules() if isinstance(m, torch.nn.Conv2d)]
    if not convs:
        return None
    pre = model.preprocessing
    x = eval_transforms(pre)(image)[None].to(device)
    with torch.enable_grad(), GradCAM(model=model.net, target_layers=[convs[-1]]) as cam:
        heat = cam(input_tensor=x, targets=[ClassifierOutputTarget(class_index)])[0]
    mean, std = torch.tensor(pre.mean)[:, None, None], torch.tensor(pre.std)[:, None, None]
    rgb = (x[0].cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(show_cam_on_image(rgb, heat, use_rgb=True)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def model_info(ckpt: Path | None, onnx: Path | None, min_confidence: str | None = None) -> dict:
    """What ``GET /info`` says of the model: its classes, preprocessing, file, hash, temperature,
    and the answer policy in force: ``--min_confidence`` over the one the model stores."""
    path = onnx or ckpt
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if onnx is not None:
        from project.extras.deploy.infer import OnnxClassifier

        clf = OnnxClassifier(onnx)
        names, pre, state = clf.class_names, clf.preprocessing, clf.answers.state
    else:
        from project.checkpoints import load_model

        model = load_model(ckpt)
        names, pre, state = model.class_names, model.preprocessing, model.answer_state()
    if min_confidence is not None:  # the answers use the override: /info must not show the stored one
        state = {**state, "min_confidence": min_confidence}
    return {"classes": names, "task": state.get("task"), "file": str(path), "sha256": digest,
            "cam": onnx is None and answers.answers(names, state).explained(np.zeros(len(names))) is not None,
            "temperature": state.get("temperature", 1.0), "answers": state,
            "preprocessing": {"image_size": pre.image_size, "resize_size": pre.resize_size,
                              "crop_ratio": pre.crop_ratio, "interpolation": pre.interpolation,
                              "mean": list(pre.mean), "std": list(pre.std)}}


def add_page(app, html: str) -> None:
    """The page to try the model at ``/``, in place of LitServe's plain "litserve running"."""
    from fastapi.responses import HTMLResponse

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/"]
    app.add_api_route("/", lambda: HTMLResponse(html), methods=["GET"], include_in_schema=False)


def check_port(host: str, port: int) -> None:
    """Bind ``host:port`` as uvicorn will (SO_REUSEADDR, IPv6 for a host with ':') and let it go:
    a taken port is then one line before the model loads, not uvicorn's log line and exit 3."""
    if not 1 <= port <= 65535:
        raise ProjectError(f"--port {port} is not a TCP port: pass one from 1 to 65535, e.g. --port 8000")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror as err:
            raise ProjectError(f"--host {host!r} is not a known host name ({err.strerror}): pass an "
                               "address of this machine, e.g. --host 127.0.0.1 or --host 0.0.0.0") from None
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ProjectError(f"--port {port} is taken on {host} (another server listens there): "
                                   "stop it or pass another --port") from None
            if err.errno == errno.EACCES:
                raise ProjectError(f"--port {port} needs more rights on this machine: pass a port "
                                   "from 1024 up, e.g. --port 8000") from None
            raise ProjectError(f"cannot serve on --host {host} --port {port}: {err.strerror}: pass an "
                               "address of this machine (e.g. --host 127.0.0.1) and a free port") from None


def stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m project serve", description=__doc__.split("\n")[0])
    p.add_argument("--ckpt_path", default="best", help="a .ckpt, a run folder, best or last")
    p.add_argument("--onnx", default=None, help="an exported model.onnx instead (no torch at request time)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    answers.add_arguments(p)
    p.add_argument("--max_batch_size", type=positive_int, default=1,
                   help="dynamic batching: requests per batch")
    p.add_argument("--batch_timeout", type=float, default=0.0, help="seconds a batch waits to fill")
    p.add_argument("--workers", type=positive_int, default=1, help="worker processes per device")
    p.add_argument("--accelerator", type=accelerator, default="auto", help="auto, cpu or cuda")
    p.add_argument("--max_upload_mb", type=float, default=20.0, help="larger requests get 413")
    return p


def make_api(a: argparse.Namespace, ckpt: Path | None, onnx: Path | None) -> ClassifierAPI:
    """The API from the parsed options (the answer options reach it here, as predict's do)."""
    return ClassifierAPI(ckpt, onnx, a.top_k, a.min_confidence, a.max_batch_size, a.batch_timeout)


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    # batch/unbatch pass the requests through; with max_batch_size 1 LitServe does not call them
    warnings.filterwarnings("ignore", message="The LitServer has both batch and unbatch")
    if a.max_batch_size < 1 or a.batch_timeout < 0:
        raise ProjectError("--max_batch_size must be >= 1 and --batch_timeout >= 0")
    check_port(a.host, a.port)  # before the model loads: seconds, and then the server would fail
    onnx = Path(a.onnx) if a.onnx else None
    if onnx is not None and not onnx.is_file():
        raise ProjectError(f"--onnx '{onnx}' does not exist")
    if onnx is None:
        from project.runs import resolve_checkpoint

        ckpt = resolve_checkpoint(a.ckpt_path)
    else:
        ckpt = None
    try:
        info = model_info(ckpt, onnx, a.min_confidence)  # fails in one line before the server starts
    except ValueError as err:  # not an ONNX model, or its metadata is not this project's
        raise ProjectError(str(err)) from None
    answers.answers(info["classes"], info["answers"]).policy(a.min_confidence)  # so does a bad policy
    api = make_api(a, ckpt, onnx)
    accelerator = "cpu" if onnx is not None else a.accelerator
    server = ls.LitServer(api, accelerator=accelerator, workers_per_device=a.workers, model_metadata=info,
                          max_payload_size=int(a.max_upload_mb * 2**20), middlewares=[RawBody])
    page = Path(__file__).with_name("page.html").read_text(encoding="utf-8")
    add_page(server.app, page)
    print(f"Serving {info['file']} ({len(info['classes'])} classes) on http://{a.host}:{a.port}/predict",
          flush=True)
    # SIGTERM (docker stop, kill) as Ctrl+C: LitServe then stops its worker processes too
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    server.run(host=a.host, port=a.port, generate_client_file=False)
    return 0
