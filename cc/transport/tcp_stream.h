// A connected stream socket as a ByteStream (tcp from Python's rendezvous,
// or a socketpair in tests). Owns the fd.
#pragma once

#include <memory>

#include "cc/transport/byte_stream.h"

namespace hetjax {

// Takes ownership of `fd` (closed by the stream's destructor, also on
// failure here). Sets it non-blocking, TCP_NODELAY and large kernel buffers
// where the socket type supports them.
Status MakeTcpStream(int fd, std::unique_ptr<ByteStream>* stream);

}  // namespace hetjax
