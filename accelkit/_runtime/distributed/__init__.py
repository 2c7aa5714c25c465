"""The distributed path: the device's c10d backend, a host-staged process group over gloo, the
agreement check between ranks and its channel, reductions gloo lacks, and collective statistics."""
