"""Layer 0, pure helpers: the output contract (:mod:`.contract`), text offsets and segmentation (:mod:`.text`),
literal parsing (:mod:`.literals`), default locations (:mod:`.paths`), secret redaction (:mod:`.redact`), JSON-lines
files and atomic writes (:mod:`.fileio`), thread pools (:mod:`.parallel`), task names (:mod:`.tasks`), decision
outputs read from token log-probabilities (:mod:`.decisions`), the evidence seam (:mod:`.retrieval`) and the one
extension registry (:mod:`.extensions`). Nothing here imports another halluscope layer."""
