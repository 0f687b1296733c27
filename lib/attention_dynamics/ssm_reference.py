"""Our selective SSM against the reference implementation it follows, mambapy's
``MambaBlock`` (R9; chapter *One routing law for attention and selective SSMs*)."""
from __future__ import annotations

import torch

from .gradcheck import relative_error

__all__ = ["mambapy_agreement"]


def mambapy_agreement(sizes, *, seed: int = 0) -> list[dict]:
    """Our :class:`attention_dynamics.ssm.SelectiveSSM` loaded with the state dict of the
    reference implementation's block (``mambapy.mamba.MambaBlock``) for each (d_model,
    d_state, expand, T) of ``sizes``: the normwise relative difference of the outputs on the
    same random inputs, in float32 (sequential scans), and in float64 against the
    reference's sequential and parallel scans, our A and D rounded to float32 as the
    reference rounds them internally."""
    from mambapy.mamba import MambaBlock, MambaConfig

    from .ssm import SSMConfig, SelectiveSSM

    rows = []
    for i, (d_model, d_state, expand, T) in enumerate(sizes):
        torch.manual_seed(seed + i)
        ref = {scan: MambaBlock(MambaConfig(d_model=d_model, n_layers=1, d_state=d_state, expand_factor=expand,
                                            d_conv=4, pscan=scan == "parallel")) for scan in ("sequential", "parallel")}
        ref["parallel"].load_state_dict(ref["sequential"].state_dict())
        ours = SelectiveSSM(SSMConfig(n_out=1, d_model=d_model, d_state=d_state, expand=expand, d_conv=4, d_in=1))
        ours.load_state_dict(ref["sequential"].state_dict())
        h = torch.randn(3, T, d_model)
        with torch.no_grad():
            row = {"d_model": d_model, "d_state": d_state, "expand": expand, "T": T,
                   "float32": relative_error(ours(h)[0], ref["sequential"](h))}
            for r in ref.values():
                r.double()
            ours.double()
            ours.A_log.copy_(torch.log(torch.exp(ours.A_log.float()).double()))
            ours.D.copy_(ours.D.float().double())
            row["float64"] = relative_error(ours(h.double())[0], ref["sequential"](h.double()))
            row["float64, parallel scan"] = relative_error(ours(h.double())[0], ref["parallel"](h.double()))
        rows.append(row)
    return rows
