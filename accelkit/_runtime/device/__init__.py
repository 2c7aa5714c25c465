"""What every execution path shares: the active backend's context, device tensors over emulated
storage, the devices of a process, the device module, streams, the device generator,
serialization and the gradient scaler."""
