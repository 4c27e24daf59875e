"""The published works the reproduction report quotes, and where each quoted abstract was read.

A claim quotes its paper's abstract in the paper's own words. Where the
abstract's text could not be found (``abstract_missing`` says so and what a
reader can check instead), the claims that cite it say that their figures are
the paper's as read for terastack, not a quotation a reader can check here.
A ``related`` work is not one terastack reproduces: it is cited beside a seed
paper for a figure its own abstract states.
"""
from __future__ import annotations

from dataclasses import dataclass

#: the unquoted-figure marker a claim's text carries when its paper's abstract was not found
UNQUOTED = "as read for terastack; the abstract's text was not found to quote"


@dataclass(frozen=True, kw_only=True, slots=True)
class Paper:
    #: how a claims table cell names it
    short: str
    #: the full reference: authors, title, venue, DOI or address (as far as they are known)
    reference: str
    #: the address where the abstract the claims quote was read
    abstract_at: str = ""
    #: with no ``abstract_at``: that the abstract was not found, and what a reader can check instead
    abstract_missing: str = ""
    #: "seed" (a paper terastack reproduces) or "related" (cited beside one for a figure of its own)
    role: str = "seed"

    def __post_init__(self) -> None:
        if bool(self.abstract_at) == bool(self.abstract_missing):
            raise ValueError(f"paper {self.short}: give exactly one of abstract_at (where the quoted abstract was "
                             f"read) and abstract_missing (why there is no quotation)")
        if self.role not in ("seed", "related"):
            raise ValueError(f"paper {self.short}: role: must be 'seed' or 'related', got {self.role!r}")

    def where_quoted(self) -> str:
        """One line for the report's sources: where the abstract was read, or that it was not found."""
        if self.abstract_at:
            return f"abstract quoted from {self.abstract_at}"
        return f"abstract not found: {self.abstract_missing}"


#: the works the claims cite, as a reader finds them
PAPERS = {
    "CAM": Paper(short="CAM (Song et al., ICDE 2025)",
                 reference="Ziyu Song, Jie Zhang, Jie Sun, Mo Sun, Zihan Yang, Zheng Zhang, Xuzheng Chen, Fei Wu, "
                           "Huajin Tang, Zeke Wang. CAM: Asynchronous GPU-Initiated, CPU-Managed SSD Management for "
                           "Batching Storage Access. IEEE ICDE 2025, pp. 2309-2322. doi:10.1109/ICDE65448.2025.00175",
                 abstract_missing="its text was not found, only the paper's PDF record "
                                  "(https://wangzeke.github.io/doc/cam-ICDE25.pdf); the CAM rows give the abstract's "
                                  "figures and baseline words as read for terastack, to be checked against the paper"),
    "Ratel": Paper(short="Ratel (Liao et al., ICDE 2025)",
                   reference="Changyue Liao, Mo Sun, Zihan Yang, Jun Xie, Kaiqi Chen, Binhang Yuan, Fei Wu, Zeke "
                             "Wang. Ratel: Optimizing Holistic Data Movement to Fine-tune 100B Model on a Consumer "
                             "GPU. IEEE ICDE 2025, pp. 292-306. doi:10.1109/ICDE65448.2025.00029; preprint "
                             "arXiv:2403.06504 (v1: Adding NVMe SSDs to Enable and Accelerate 100B Model "
                             "Fine-tuning on a Single GPU, its system named Fuyou; v2: LoHan)",
                   abstract_at="https://arxiv.org/abs/2403.06504 (v2, LoHan; v1, Fuyou, for the baseline it "
                               "names)"),
    "Hyperion": Paper(short="Hyperion (ICDE 2025)",
                      reference="Hyperion: a cost-efficient out-of-core GNN training system with a GPU-initiated "
                                "asynchronous disk I/O stack. IEEE ICDE 2025; paper and code listed at "
                                "https://github.com/RC4ML/Hyperion",
                      abstract_missing="the paper's abstract was not found; its project page "
                                       "(https://github.com/RC4ML/Hyperion) is quoted where it states a figure, "
                                       "and its other figures are the paper's as read for terastack"),
    "Helios": Paper(short="Helios (Sun et al., arXiv 2023)",
                    reference="Jie Sun, Mo Sun, Zheng Zhang, Jun Xie, Zuocheng Shi, Zihan Yang, Jie Zhang, Fei Wu, "
                              "Zeke Wang. Helios: An Efficient Out-of-core GNN Training System on Terabyte-scale "
                              "Graphs with In-memory Performance. arXiv:2310.00837 (2023): the same group's earlier "
                              "preprint of the GPU-initiated asynchronous disk I/O stack",
                    abstract_at="https://arxiv.org/abs/2310.00837", role="related"),
    "DisDP": Paper(short="DisDP (seed paper of terastack.disdp)",
                   reference="DisDP: disaggregated data parallelism, the seed paper terastack.disdp implements "
                             "(collectives off the compute units, a single parameter server); its full reference "
                             "was not found in the sources searched for this report",
                   abstract_missing="the paper and its abstract were not found; the DisDP rows give its "
                                    "abstract's figures as read for terastack. The related preprint LuWu "
                                    "(arXiv:2409.00918) states the 3.98x figure in its own abstract"),
    "LuWu": Paper(short="LuWu (arXiv:2409.00918, related preprint)",
                  reference="LuWu: An End-to-End In-Network Out-of-Core Optimizer for 100B-Scale Model-in-Network "
                            "Data-Parallel Training on Distributed GPUs. arXiv:2409.00918 (2024): an in-network "
                            "optimizer node with SmartNIC-SmartSwitch collectives, the design DisDP's names",
                  abstract_at="https://arxiv.org/abs/2409.00918", role="related"),
    "DaCe": Paper(short="DaCe (Ziogas et al., SC'21)",
                  reference="Alexandros Nikolaos Ziogas, Timo Schneider, Tal Ben-Nun, Alexandru Calotoiu, Tiziano De "
                            "Matteis, Johannes de Fine Licht, Luca Lavarini, Torsten Hoefler. Productivity, "
                            "Portability, Performance: Data-Centric Python. SC '21. doi:10.1145/3458817.3476176",
                  abstract_at="https://sc21.supercomputing.org/proceedings/tech_paper/tech_paper_pages/pap301.html"),
    "DaCe-SCC": Paper(short="the SC22 Student Cluster Competition reproduction of DaCe",
                      reference="The SC22 Reproducibility Challenge of the Student Cluster Competition, which reran "
                                "the SC'21 paper's benchmarks (https://sc22.supercomputing.org/2022/06/13/student-"
                                "cluster-competition-benchmark-selected/); the teams' results are discussed in "
                                "Ziogas et al., Productivity, Portability, Performance, and Reproducibility: "
                                "Data-Centric Python, IEEE TPDS 36(5), 2025. doi:10.1109/TPDS.2025.3549310. "
                                "terastack's seed is one team's reproduction report (Azure CycleCloud, up to 32 "
                                "nodes / 64 processes)",
                      abstract_missing="the team's reproduction report itself was not found; what it reran is "
                                       "described here as read for terastack, and the TPDS abstract says only that "
                                       "the benchmarks were reproduced in the SC22 competition"),
}
