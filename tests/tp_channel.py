"""The tensor-parallel leader's broadcast without torch.distributed: an in-memory byte channel that a
`MirroredTarget` sends its tp_wire messages into and a follower (`ssd.engine.target_tp.follow`) reads from."""


class ByteChannel:
    def __init__(self):
        self.ops: list[bytes] = []

    def send(self, data) -> None:
        self.ops.append(bytes(data))

    def recv(self) -> bytes:
        return self.ops.pop(0)
