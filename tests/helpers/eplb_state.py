"""What an engine's EPLB runtime did, read from its workers (``llm.collective_rpc``), and
the check that every rank agrees on it."""
from __future__ import annotations


def worker_eplb_state(worker) -> dict:
    """The updator's record, and whether every local slot holds exactly the checkpoint
    weights of the logical expert its layer's map names."""
    import glob
    import os

    import torch
    from safetensors import safe_open

    updator = worker.model_runner.npu_eplb
    tensors = {}
    for f in glob.glob(os.path.join(worker.model_config.model, "*.safetensors")):
        with safe_open(f, "pt") as st:
            tensors.update({k: st.get_tensor(k) for k in st.keys() if ".experts." in k})
    consistent = {}
    for view in updator.views:
        w13, w2 = view.weights
        prefix = f"model.layers.{view.layer_id}.mlp.experts"
        ok = True
        for slot, e in enumerate(view.method._local):
            gate, up, down = (tensors[f"{prefix}.{e}.{n}_proj.weight"]
                              for n in ("gate", "up", "down"))
            # the checkpoint in the model's dtype: what loading it gives
            ok &= torch.equal(w13[slot], torch.cat([gate, up]).to(w13.dtype)) \
                and torch.equal(w2[slot], down.to(w2.dtype))
        consistent[view.layer_id] = ok
    return {"history": [(r.index, r.balancedness_before, r.balancedness_after,
                         r.layers_moved, r.experts_moved, r.rolled_back, r.step)
                        for r in updator.history],
            "balancedness": list(updator.balancedness_log),
            "placements": {v.layer_id: v.placement.phy2log for v in updator.views},
            "consistent": consistent}


def check_ranks_agree(states: list[dict]) -> None:
    assert all(s["consistent"] and all(s["consistent"].values()) for s in states), states
    assert all(s["placements"] == states[0]["placements"] for s in states)
    assert all(s["history"] == states[0]["history"] for s in states)
