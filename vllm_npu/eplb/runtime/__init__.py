"""The EPLB serving runtime (torch): `adaptor` finds the MoE layers, `recorder` keeps the
load window on the device, `updator` runs collect -> plan -> migrate -> commit, `transfer`
moves expert weights between ranks, `startup` adopts vLLM's --enable-eplb settings."""
