"""Fetching the SentEval data into the user cache, and the "missing files" error.

Sources (the canonical ones that SimCSE and SentEval use):

* ``senteval.tar`` from princeton-nlp's Hugging Face dataset repo, what SimCSE's
  ``SentEval/data/downstream/download_dataset.sh`` fetches, through ``huggingface_hub`` (the
  shared HF cache, resumable, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``; see
  :func:`cselab.model.hub.hub_dataset_file`): all 14 tasks already processed by
  SentEval's ``get_transfer_data.bash`` (Moses tokenisation for STS/SICK, ``cat -v`` + PTB sed
  for MR/CR/SUBJ/MPQA, quote removal for TREC). Only the files the tasks read are extracted.
* if the archive cannot be fetched, the three tasks that need no tokeniser come file by file
  from the addresses in SentEval's ``get_transfer_data.bash``: SST-2 (PrincetonML/SIF), MRPC
  (FAIR's copy) and TREC (Li & Roth's site; backquotes and apostrophes removed as SentEval's
  ``sed`` does). These are not on the Hub: plain HTTP, via a temporary file.

Every fetched file is checked against the SHA-256 of the copy this project was validated on
(the numbers in ``docs/evaluation.md`` come from those bytes); a mismatch is a warning.
Downloads only ever go to the cache folder (``default_cache_dir()``); any other folder is
never written to.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
import urllib.request
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

from cselab.model.hub import SIMCSE_DATA_REPO, ResolveError, hub_dataset_file

from ..core.errors import MissingDataSettingError
from ..io.files import file_digest  # hashing needs no torch: cselab.io imports only cselab.core
from .datasets import (
    ENV_VAR,
    TASK_FILES,
    MissingDataError,
    default_cache_dir,
    resolve_data_dir,
)

log = logging.getLogger(__name__)

ARCHIVE_FILE = "senteval.tar"
#: where to get it by hand (the download itself goes through huggingface_hub)
ARCHIVE_URL = f"https://huggingface.co/datasets/{SIMCSE_DATA_REPO}/resolve/main/{ARCHIVE_FILE}"
_SST = "https://raw.githubusercontent.com/PrincetonML/SIF/master/data"
_FAIR = "https://dl.fbaipublicfiles.com/senteval/senteval_data"
_TREC = "http://cogcomp.cs.illinois.edu/Data/QA/QC"


def _drop_quotes(data: bytes) -> bytes:
    """SentEval: ``sed -e "s/\\`//g" -e "s/'//g"`` on the TREC files."""
    return data.replace(b"`", b"").replace(b"'", b"")


#: relative path -> (url, transform) for files that can be fetched one by one
DIRECT_SOURCES: dict[str, tuple[str, Callable[[bytes], bytes] | None]] = {
    **{
        f"SST/binary/sentiment-{s}": (f"{_SST}/sentiment-{s}", None)
        for s in ("train", "dev", "test")
    },
    **{
        f"MRPC/msr_paraphrase_{s}.txt": (f"{_FAIR}/msr_paraphrase_{s}.txt", None)
        for s in ("train", "test")
    },
    **{f"TREC/{f}": (f"{_TREC}/{f}", _drop_quotes) for f in ("train_5500.label", "TREC_10.label")},
}

# sha256sum-style list of the files the loaders read, as validated for this project
_SHA256 = """
ec94532766f6f962094841ab3bee2ad6f232f996c3756825a91e78bcc294750f  CR/custrev.neg
91a20a4ffeb5d38a39a4087bb247e16538aff21e7d621ae59738379f39f21732  CR/custrev.pos
8da6e035fa4cea02f0555091096b29a6b3995ff0adf41fad25008dcee066b79e  MPQA/mpqa.neg
7487dbb74c77383e60b292845495163a9e21fb70a4fdacdda933413e43163f0d  MPQA/mpqa.pos
c4ac36eaa8adc8ee31c31f69594bfbe68d83ef5b6db53f1f19b28c0be52f3999  MR/rt-polarity.neg
34e5b0da2d491e46b700b00afe735aaae0962bcfe4f7f22b2d8077e714fa370f  MR/rt-polarity.pos
a04e271090879aaba6423d65b94950c089298587d9c084bf9cd7439bd785f784  MRPC/msr_paraphrase_test.txt
60a9b09084528f0673eedee2b69cb941920f0b8cd0eeccefc464a98768457f89  MRPC/msr_paraphrase_train.txt
d0362afe8304c8d08166b82d76da2a8c665d5b635ac1f3f1ee82054511749f97  SICK/SICK_test_annotated.txt
0d0786bd8671a0a70614f2f890b8ab24b3c24d1ccb624bcca87618091fbe4f11  SICK/SICK_trial.txt
9a6c7403b71a9b762158387afe4431253ae10cdfb2319b5275289f3766f48291  SST/binary/sentiment-dev
4fefd1cd67526cf87ebc7fafc3afc21cc7cfa6ae53b45e74f77f9456e3c62752  SST/binary/sentiment-test
10a92a297ec38e262386e5a2713b4bc70e5d18ced88b7f54bd171a26e5b34ab5  SST/binary/sentiment-train
5526be59228bc34ccb3cb6f1f56c0d7278d3419b8886713ae016fd92b151f19c  STS/STS12-en-test/STS.gs.MSRpar.txt
9c6096c6bcfb0144c8bbddb00900ca9198c88498630cd0c8f08d18365f1d7150  STS/STS12-en-test/STS.gs.MSRvid.txt
708530c4d006d06881f3289fce35d624d7efe562dcf0fe5f8aa0eec3a135f6d4  STS/STS12-en-test/STS.gs.SMTeuroparl.txt
088d8ca22c0aa406e4a5d2e6e308a4f38b482b8e736c2445a38ffb6e4c4fb4fd  STS/STS12-en-test/STS.gs.surprise.OnWN.txt
aa6dfc868db333c43dc59be14d46fa6587c7ebddc0d497e717f647bf35121cf1  STS/STS12-en-test/STS.gs.surprise.SMTnews.txt
21c0c6cc32f68f69d672dfae0f86935cdc2627bae4941381692941aa9320f8c4  STS/STS12-en-test/STS.input.MSRpar.txt
c4a92a3645744f77d1cda9f2af7da5d11e807ae296f6a20fe5930403fb9c4dfe  STS/STS12-en-test/STS.input.MSRvid.txt
05acf33c0fcb592347f49e279137a17e0244d7b0d37cc113134320a5d3f586e1  STS/STS12-en-test/STS.input.SMTeuroparl.txt
e605c67de4b7cee2c5629239d209e2845920f475ebd0468bdcf03d8da2ffa9cf  STS/STS12-en-test/STS.input.surprise.OnWN.txt
cc4a0b9a1355c5680a8a37c02f2d08e35f95754b9f89a2a4a05088ee5ff57ffe  STS/STS12-en-test/STS.input.surprise.SMTnews.txt
8ca95b7228119578e2007839cf7969f22c4f1fd41fd610c4b7f9683072d98066  STS/STS13-en-test/STS.gs.FNWN.txt
0cd497aaddb00a2fb6db25f77bccfc09e8aa012e11549b81b434bab1a27ad954  STS/STS13-en-test/STS.gs.OnWN.txt
f49f64089011436dd296ef384c07160219406feef7dc4b9fa2af52a519f32bc6  STS/STS13-en-test/STS.gs.headlines.txt
a20cb41a33a528f3c089c94ef24da8eb5e26ed594937cf6fa90f3d1c79d6c53c  STS/STS13-en-test/STS.input.FNWN.txt
cb74993eef23cfa2c03da7e5a08c62e50c9baafae0fa9ba0bb5a09d8e7d2be65  STS/STS13-en-test/STS.input.OnWN.txt
637f3b4afdc8d1cc789e91a4d7217efff30e503c34a872d93e8b27e7b1136cb7  STS/STS13-en-test/STS.input.headlines.txt
1c80147df270ea4cfce14a47ed29f8a2f10d5dc016d02836077fd786ff7f535b  STS/STS14-en-test/STS.gs.OnWN.txt
ba6dc76696b5c93985590a325b4d142449932cdf0d715b2bab1b1743fe3c488c  STS/STS14-en-test/STS.gs.deft-forum.txt
105c5b333abd50c274efb4dae9e3e0dab36ed63eee780cfb49955b1586bd62f2  STS/STS14-en-test/STS.gs.deft-news.txt
f243c34647255cd0b994565ed4f58dd31506e7d9c9d6250d1a6dd14095625832  STS/STS14-en-test/STS.gs.headlines.txt
fc994ebacc7074c332626fa9e29542d7340a48a3cdb999b47cdb59c378523a62  STS/STS14-en-test/STS.gs.images.txt
0098c644bfeaa2d511a8297b1940771865900c372c9dd49a62726dc5ec02c9a3  STS/STS14-en-test/STS.gs.tweet-news.txt
8cd2333328d17e3212afa2d43dd934c5521e3fd35fc786b992dc7864f9d34f8f  STS/STS14-en-test/STS.input.OnWN.txt
b39579e59c7b9f4063545c3d4643f8db16dc060cd0a35447ef56ff0aabec9d83  STS/STS14-en-test/STS.input.deft-forum.txt
cc450dcd9228211c1a311de1ff28199f166dce6f7fc81dcb5ce968a3a8a80d2d  STS/STS14-en-test/STS.input.deft-news.txt
2ed0ea55d196cdbb440ed428eb1846dcb43486a692aafb22b3bc5c14c44407c8  STS/STS14-en-test/STS.input.headlines.txt
295fc99f8a9215c330b36a08bc1ff3e428f10057be5bb915262111494b3616e2  STS/STS14-en-test/STS.input.images.txt
b25b3768762aa7cdcd89f2a25ce5049de7e4cd51b138227c3a31092ae8e2b5f5  STS/STS14-en-test/STS.input.tweet-news.txt
1644301a7540e5484da285002e9269062852efb2272be614cad99c9530f6a102  STS/STS15-en-test/STS.gs.answers-forums.txt
028db213140f8c7aef7497c4ae38b6380938f20359852231669c83dce11c3701  STS/STS15-en-test/STS.gs.answers-students.txt
5736192faaccbdbecd0ef6b73ec04b24115cd2e48d55dc3b1b170da3d2a81c75  STS/STS15-en-test/STS.gs.belief.txt
e8e432f769c8a94ddb62ae3343890ac24a9dd78a116d56c707313bc59413dd56  STS/STS15-en-test/STS.gs.headlines.txt
ed8878209098c77ca7f02ac413d3fd698f92ad3425999555e50fda89fc46012a  STS/STS15-en-test/STS.gs.images.txt
b8f1bc125559adbb3ac5b33206472b217c12621c3a6b5a8575da47dc0b536fc4  STS/STS15-en-test/STS.input.answers-forums.txt
4893f736e84cea176c39c882250f6513d5bbcfa6ebe8d3ffabcef6056d0471a7  STS/STS15-en-test/STS.input.answers-students.txt
a54ec7af1924c900d8474586abae465819d2c03c73561aa2e76e7fa5e836faff  STS/STS15-en-test/STS.input.belief.txt
85d90b0f8f258a47758808d382188ba2ee7b1adbbf84feb776afad0e4691d5d1  STS/STS15-en-test/STS.input.headlines.txt
0dac9494186838a8f4dfbb4ee290fec8d7581cf84a33d615c522700b3b50e0d6  STS/STS15-en-test/STS.input.images.txt
332efd741b0cb247d20dd2a6cec854360c921c7e6b395f328f562d8d26057214  STS/STS16-en-test/STS.gs.answer-answer.txt
01e33a95996201a6e81e3cce9eda0f15048b77613ea64dce2929bb35479f7d85  STS/STS16-en-test/STS.gs.headlines.txt
29984944a91aaff484f2b2e5d4d434fc8a6f5ef6f578a880cccd2786f5142fdc  STS/STS16-en-test/STS.gs.plagiarism.txt
81947ed9dbe7f85b7bd249df68ed5c7b2f16f06390ad568eb5554b1e26bc5577  STS/STS16-en-test/STS.gs.postediting.txt
cf9ebf9d140191f73620cda0560947ad9283c910735d0d541b8a401a5e64afb0  STS/STS16-en-test/STS.gs.question-question.txt
ebbffced7d4630755e61d4dfe4d82121198965a14b9f5734b5abedb961f0725c  STS/STS16-en-test/STS.input.answer-answer.txt
705c3e82fb85fa3b6706a481b790e1030304ddc9c72d39e126693ed44b258ba6  STS/STS16-en-test/STS.input.headlines.txt
dd4ca54d1dfcd7d1cabe67f0de98cde23f4c1696ecc0003afbecae1274305d63  STS/STS16-en-test/STS.input.plagiarism.txt
9b455d8da1d1bae692d038da1d431827d23bfec04c64b109efc3b6b620fd422f  STS/STS16-en-test/STS.input.postediting.txt
58920c7da7dbc1b860609310782d88b7457d599c90a226819b5880262dd7f58a  STS/STS16-en-test/STS.input.question-question.txt
c558fa95fec006608f13e3d942f153b614beabccbf33e64f36418d406a895e37  STS/STSBenchmark/sts-dev.csv
22ef3e10603b6655d7c7978c8eee26e7d5291dd5a71c5531b934fb025c108cbf  STS/STSBenchmark/sts-test.csv
d8ccd43f1674f1c17e4ab717564e3561cfb719b0db4cfb19e5677427c68ff8a1  SUBJ/subj.objective
274c2ffe59c204dc4df779848561786f59a98cc20dda3cfdd7d9f76a4f730710  SUBJ/subj.subjective
86ad53c8fc9d397ab2f4be7c967d8efb470b260140557d3e57afad69d1b88b76  TREC/TREC_10.label
8bd6e79493f43bbd22c364587366a1dced54e1e31259eaa92721a0f526031116  TREC/train_5500.label
"""
SHA256: dict[str, str] = {
    rel: digest for digest, rel in (line.split() for line in _SHA256.strip().splitlines())
}


def verify(data_dir: str | os.PathLike[str], files: Iterable[str] | None = None) -> list[str]:
    """Relative paths whose bytes differ from the validated copy (absent files are skipped)."""
    root = Path(data_dir)
    bad = []
    for rel in files if files is not None else SHA256:
        path = root / rel
        if rel in SHA256 and path.is_file() and file_digest(path) != SHA256[rel]:
            bad.append(rel)
    return bad


def _fetch(url: str, dest: Path, timeout: float = 60.0) -> None:
    """Stream ``url`` to ``dest`` (via a temporary file, so a failed download leaves nothing)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s", url)
    request = urllib.request.Request(url, headers={"User-Agent": "cselab"})
    tmp = tempfile.NamedTemporaryFile(dir=dest.parent, delete=False)  # noqa: SIM115
    try:
        with tmp, urllib.request.urlopen(request, timeout=timeout) as response:
            shutil.copyfileobj(response, tmp, length=1 << 20)
        os.replace(tmp.name, dest)
    except BaseException:
        Path(tmp.name).unlink(missing_ok=True)
        raise


def _extract_from_archive(archive: Path, root: Path, wanted: set[str]) -> set[str]:
    """Copy the members whose path ends with a wanted relative path; returns those found.

    Members are read and written by name (never ``extractall``), so an archive cannot write
    outside ``root``.
    """
    found: set[str] = set()
    with tarfile.open(archive) as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = member.name.replace("\\", "/")
            for rel in wanted - found:
                if name == rel or name.endswith("/" + rel):
                    src = tar.extractfile(member)
                    if src is None:
                        continue
                    target = root / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    partial = target.with_name(target.name + ".partial")
                    partial.write_bytes(src.read())
                    os.replace(partial, target)  # never a half file under the final name
                    found.add(rel)
                    break
    return found


def download(files: Iterable[str], root: str | os.PathLike[str]) -> list[str]:
    """Fetch the given relative paths into ``root``; returns those still missing afterwards."""
    root = Path(root)
    wanted = set(files)
    errors: list[str] = []
    try:
        archive = hub_dataset_file(SIMCSE_DATA_REPO, ARCHIVE_FILE)
        wanted -= _extract_from_archive(archive, _existing_parent(root), wanted)
    except (ResolveError, OSError, tarfile.TarError) as exc:
        errors.append(f"{ARCHIVE_URL}: {exc}")
    for rel in sorted(wanted):
        if rel not in DIRECT_SOURCES:
            continue
        url, transform = DIRECT_SOURCES[rel]
        try:
            _fetch(url, root / rel)
            if transform is not None:
                (root / rel).write_bytes(transform((root / rel).read_bytes()))
            wanted.discard(rel)
        except OSError as exc:
            errors.append(f"{url}: {exc}")
    for err in errors:
        log.warning("download failed: %s", err)
    fetched = [f for f in files if f not in wanted]
    for rel in verify(root, fetched):
        warnings.warn(
            f"{root / rel}: downloaded file differs from the copy cselab was validated on "
            "(SHA-256 mismatch); numbers may differ from docs/evaluation.md",
            stacklevel=2,
        )
    return sorted(wanted)


def _existing_parent(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def missing_data_error(
    root: Path, missing: list[str], tried_download: bool, option: str | None = None
) -> MissingDataError:
    """The error: which files are missing and where to get them, and how to point at another
    folder: the setting ``data_dir=DIR`` (a :class:`~cselab.core.errors.SettingError`, which a
    command line shows as its flag), or ``option`` when the caller says it (a run's
    ``--eval.data_dir=DIR``)."""
    shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} files)" if len(missing) > 8 else "")
    how = (
        "the download failed (offline?)"
        if tried_download
        else "this folder is not the download cache, so nothing was downloaded"
    )
    before = (
        f"SentEval data missing in {root}: {shown}; {how}. Get SimCSE's processed copy "
        f"({ARCHIVE_URL}, extracted into {root} so that it holds STS/, CR/, ... as the "
        "archive does) or "
        f"run SentEval's data/downstream/get_transfer_data.bash, then pass "
    )
    after = f" or set ${ENV_VAR}."
    if option is not None:
        return MissingDataError(before + option + after)
    return MissingDataSettingError(
        "data_dir", "DIR", "{before}{setting}{after}", placeholder=True, before=before, after=after
    )


def ensure_files(
    files: Iterable[str],
    data_dir: str | os.PathLike[str] | None = None,
    download_missing: bool = True,
    option: str | None = None,
) -> Path:
    """The data folder, after downloading any of ``files`` (relative paths) it lacks.

    Downloads happen only when the folder is the cache (``default_cache_dir()``); otherwise,
    or offline, :class:`MissingDataError` lists the missing files and their sources, and names
    ``data_dir=DIR`` (or ``option``) as the way to point at another folder.
    """
    root = resolve_data_dir(data_dir)
    missing = [rel for rel in dict.fromkeys(files) if not (root / rel).is_file()]
    if not missing:
        return root
    tried = False
    if download_missing and root.resolve() == default_cache_dir().resolve():
        tried = True
        missing = download(missing, root)
    if missing:
        raise missing_data_error(root, missing, tried, option)
    return root


def ensure_data(
    tasks: Iterable[str],
    data_dir: str | os.PathLike[str] | None = None,
    download_missing: bool = True,
) -> Path:
    """:func:`ensure_files` for the files the given tasks read (``datasets.TASK_FILES``)."""
    tasks = list(tasks)
    unknown = [t for t in tasks if t not in TASK_FILES]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}")
    return ensure_files([rel for t in tasks for rel in TASK_FILES[t]], data_dir, download_missing)
