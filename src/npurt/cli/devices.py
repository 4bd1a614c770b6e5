"""`npurt devices`: what this machine has, per backend, and why no NPU (``npurt.discovery.discover`` formatted)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import one_line


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("devices", parents=[common], help="what this machine has, per backend, and why no NPU",
                       description="Report the engines, their devices and the NPU plugin state, the kernel's "
                                   "accel nodes and NPU drivers, DMA-BUF heaps and udmabuf, and which memory "
                                   "provider npurt's allocation uses.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..discovery import discover

    report = discover()
    print(json.dumps(report, indent=2) if args.json else format_devices(report))
    return 0


def format_devices(report: dict[str, Any]) -> str:
    from .. import __version__

    out: list[str] = [f"npurt {__version__}: {report['verdict']}", ""]
    out.append("npurt backends (AUTO tries them in this order)")
    installed = report["backends"]["installed"]
    for name, entry in installed.items():
        out.append(f"  {name:<12} installed; sees its NPU: {'yes' if entry['npu_present'] else 'no'}"
                   + (f" (its discovery failed: {one_line(entry['error'])})" if entry.get("error") else ""))
    for name, err in report["backends"]["failed"].items():
        out.append(f"  {name:<12} not available: {one_line(err)}")
    if not installed and not report["backends"]["failed"]:
        out.append("  none registered")
    if report["npus"]:
        out.append("")
        out.append("NPUs")
        for npu in report["npus"]:
            state = "present" if npu["present"] else ("emulator" if npu.get("emulated") else "absent")
            out.append(f"  {npu['name']} ({npu['backend']}): {state}" + ("" if npu["present"] else
                                                                         f": {npu['why_not']}"))
    ov = report["openvino"]
    out.append("")
    if ov["installed"]:
        out.append(f"OpenVINO {ov['version']}")
        for d in ov["devices"]:
            out.append(f"  {d['name']:<10} {d['full_name'] or d.get('error', '')}")
        for plugin, st in ov["plugins"].items():
            if st["devices"]:
                out.append(f"  {plugin} plugin: devices {', '.join(st['devices'])}")
            else:
                out.append(f"  {plugin} plugin: {'loaded, ' if st['loaded'] else ''}no device: {st['why_not']}")
    else:
        out.append(f"OpenVINO: {ov['error']}")
    ort = report["onnxruntime"]
    out.append("")
    if ort["installed"]:
        out.append(f"ONNX Runtime {ort['version']}")
        out.append(f"  providers  {', '.join(ort['providers'])}")
        for d in ort["ep_devices"]:
            out.append(f"  EP device  {d['ep_name']} ({d['ep_vendor']}) on {d['device_type']} ({d['device_vendor']})"
                       + ("  [an emulator: the NPU's compiler and numerics, not its speed]" if d["emulated"] else ""))
        for p in ort["plugin_packages"]:
            out.append(f"  plugin EP  {p['module']} {p['version']}: "
                       + ("registered" if p["registered"] else f"not registered: {one_line(p['error'])}"))
        out.append("  Vitis AI   " + ("VitisAIExecutionProvider installed" if ort["vitis_ai"] else
                                      f"not installed: {ort['why_not']}"))
    else:
        out.append(f"ONNX Runtime: {ort['error']}")
    k = report["kernel"]
    out.append("")
    out.append("Kernel")
    nodes = [f"{n['path']} ({n['driver'] or 'driver unknown'}{'' if n['accessible'] else ', no access'})"
             for n in k["accel_nodes"]]
    out.append(f"  /dev/accel     {', '.join(nodes) if nodes else 'no accel device nodes'}")
    out.append("  NPU drivers    " + "; ".join(f"{n}: {'loaded' if d['loaded'] else 'not loaded'}"
                                               for n, d in k["npu_drivers"].items()))
    heaps = [f"{h['name']}{'' if h['accessible'] else ' (no access)'}" for h in k["dma_heaps"]]
    out.append(f"  DMA-BUF heaps  {', '.join(heaps) if heaps else 'none (/dev/dma_heap is absent)'}")
    u = k["udmabuf"]
    out.append("  udmabuf        " + ("/dev/udmabuf" + ("" if u["accessible"] else " (no access)") if u["present"]
                                      else "absent (/dev/udmabuf; module udmabuf not loaded)"))
    out.append(f"  memfd          {'yes' if k['memfd'] else 'no'}")
    m = report["memory"]
    out.append("")
    out.append(f"Memory: \"auto\" allocation uses {m['actual'] or m['expected']}"
               + (f" ({m['note']})" if m["note"] else ""))
    if report["needed"]:
        out.append("")
        out.append("To use an NPU, this machine would need:")
        out += [f"  - {n}" for n in report["needed"]]
    return "\n".join(out)
