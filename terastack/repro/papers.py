"""The published works the reproduction report quotes, and where each quoted abstract was read.

A claim quotes its paper's abstract in the paper's own words (short quotes). The five works terastack implements
came to the project as their abstracts, its seed texts (:data:`SEED_TEXTS`): the claims quote those words, and a
figure an abstract does not state is marked in its row as derived (with the arithmetic) or as coming from another
work, named. A ``related`` work is not one terastack reproduces: it is cited beside a seed paper for a figure its
own abstract states. Where a work's abstract could not be read at all, ``abstract_missing`` says so and what a
reader can check instead.
"""
from __future__ import annotations

from dataclasses import dataclass

#: where the seed papers' abstracts were read: the texts the project was built from
SEED_TEXTS = ("terastack's seed texts, the abstracts of the five works the project implements as the project "
              "received them")


@dataclass(frozen=True, kw_only=True, slots=True)
class Paper:
    #: how a claims table cell names it
    short: str
    #: the full reference: authors, title, venue, DOI or address (as far as they are known; what is not known is
    #: said to be so)
    reference: str
    #: where the abstract the claims quote was read: an address, or :data:`SEED_TEXTS`
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
                 abstract_at=SEED_TEXTS),
    "Ratel": Paper(short="Ratel (Liao et al., ICDE 2025)",
                   reference="Changyue Liao, Mo Sun, Zihan Yang, Jun Xie, Kaiqi Chen, Binhang Yuan, Fei Wu, Zeke "
                             "Wang. Ratel: Optimizing Holistic Data Movement to Fine-tune 100B Model on a Consumer "
                             "GPU. IEEE ICDE 2025, pp. 292-306. doi:10.1109/ICDE65448.2025.00029; preprint "
                             "arXiv:2403.06504 (v1: Adding NVMe SSDs to Enable and Accelerate 100B Model "
                             "Fine-tuning on a Single GPU, its system named Fuyou, whose abstract "
                             "(https://arxiv.org/abs/2403.06504v1) names the baseline; v2: LoHan)",
                   abstract_at=SEED_TEXTS),
    "Hyperion": Paper(short="Hyperion (ICDE 2025)",
                      reference="Hyperion: a cost-efficient out-of-core GNN training system with a GPU-initiated "
                                "asynchronous disk I/O stack. IEEE ICDE 2025; paper and code listed at "
                                "https://github.com/RC4ML/Hyperion",
                      abstract_at=SEED_TEXTS),
    "Helios": Paper(short="Helios (Sun et al., arXiv 2023)",
                    reference="Jie Sun, Mo Sun, Zheng Zhang, Jun Xie, Zuocheng Shi, Zihan Yang, Jie Zhang, Fei Wu, "
                              "Zeke Wang. Helios: An Efficient Out-of-core GNN Training System on Terabyte-scale "
                              "Graphs with In-memory Performance. arXiv:2310.00837 (2023): the same group's earlier "
                              "preprint of the GPU-initiated asynchronous disk I/O stack",
                    abstract_at="https://arxiv.org/abs/2310.00837", role="related"),
    "DisDP": Paper(short="DisDP (seed paper of terastack.disdp)",
                   reference="DisDP: a fully disaggregated distributed data-parallel architecture for "
                             "model-sharded data parallelism (collectives offloaded to SmartNICs and a SmartSwitch, "
                             "optimizer states on a SmartSwitch-enhanced parameter server). Its authors, venue and "
                             "address are not among the texts terastack has; the figures quoted are its abstract's",
                   abstract_at=SEED_TEXTS),
    "DaCe": Paper(short="DaCe (Ziogas et al., SC'21)",
                  reference="Alexandros Nikolaos Ziogas, Timo Schneider, Tal Ben-Nun, Alexandru Calotoiu, Tiziano De "
                            "Matteis, Johannes de Fine Licht, Luca Lavarini, Torsten Hoefler. Productivity, "
                            "Portability, Performance: Data-Centric Python. SC '21. doi:10.1145/3458817.3476176. "
                            "Not one of terastack's seed texts: the paper the seed reproduction reran",
                  abstract_at="https://sc21.supercomputing.org/proceedings/tech_paper/tech_paper_pages/pap301.html",
                  role="related"),
    "DaCe-SCC": Paper(short="the student reproduction of DaCe (SC'21)",
                      reference="A student team's reproduction of the performance evaluation of Ziogas et al.'s "
                                "Data-Centric Python (SC'21) on CPU and GPU, on an Azure CycleCloud cluster, with "
                                "scaling runs of up to 32 nodes and 64 processes. The SC22 Student Cluster "
                                "Competition's reproducibility challenge reran that paper "
                                "(https://sc22.supercomputing.org/2022/06/13/student-cluster-competition-benchmark-"
                                "selected/); the team, venue and address of this report are not among the texts "
                                "terastack has",
                      abstract_at=SEED_TEXTS),
}
