"""Device communication: the platform's device communicator (HCCL on a device)."""
