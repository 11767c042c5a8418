"""Legacy CJK code pages told apart without a declaration: Japanese written in kanji only
(EUC-JP, Shift_JIS) is not read as Chinese (GB18030) nor Korean (CP949), and Chinese and
Korean texts keep their code pages (pure Python: no Django, no database)."""

from __future__ import annotations

import pytest

from ingestion.parsing import parse_with_report, sniff_mime_type
from ingestion.parsing.encoding import decode_text_report

KANJI_ONLY = [
    "日本国憲法第九条",
    "東京大学理学部物理学科",
    "株式会社日立製作所",
    "令和六年度予算案閣議決定",
    "厚生労働省健康局長通知",
    "北海道札幌市中央区北一条西二丁目",
    "会議資料：新製品開発計画書（社外秘）",
    "大阪府大阪市北区梅田三丁目一番一号",
    "日本銀行金融政策決定会合議事要旨",
    "神奈川県横浜市港北区",
]
WITH_KANA = [
    "政府は臨時閣議で補正予算案を決定した。総額は約十三兆円規模となる見通し。",
    "吾輩は猫である。名前はまだ無い。",
    "第一章　総則　第一条　この法律は、国民の健康の保持増進を目的とする。",
]
CHINESE = [
    "我们的知识库支持多种文件格式，包括文本、表格和演示文稿。",
    "北京今天天气很好",
    "中华人民共和国国务院",
    "上海市浦东新区人民政府",
    "国家统计局发布数据",
    "关于进一步加强安全生产工作的通知",
    "深圳市南山区科技园",
]
TRADITIONAL = [
    "我們的知識庫支援多種檔案格式",
    "國立臺灣大學圖書館",
    "行政院主計總處",
    "中華民國經濟部",
    "財團法人資訊工業策進會",
]
KOREAN = ["한국어 텍스트입니다. 문자 인코딩을 확인합니다.", "서울특별시 강남구", "대한민국 정부"]

CASES = [
    *[("euc-jp", t) for t in KANJI_ONLY + WITH_KANA],
    *[("shift_jis", t) for t in KANJI_ONLY + WITH_KANA],
    *[("gb18030", t) for t in CHINESE],
    *[("big5", t) for t in TRADITIONAL],
    *[("euc-kr", t) for t in KOREAN],
]


@pytest.mark.parametrize(("encoding", "text"), CASES)
def test_cjk_code_pages_are_told_apart(encoding: str, text: str) -> None:
    decoded = decode_text_report(text.encode(encoding))
    assert (decoded.text, decoded.warnings) == (text, [])


def test_a_kanji_only_euc_jp_file_and_page_read_as_japanese() -> None:
    text = "\n\n".join(KANJI_ONLY[:5])
    data = text.encode("euc-jp")
    report = parse_with_report(data, sniff_mime_type(data, "notice.txt"))
    assert [e.text for e in report.elements] == KANJI_ONLY[:5]
    page = f"<html><body><h1>{KANJI_ONLY[8]}</h1><p>{KANJI_ONLY[3]}</p></body></html>"
    report = parse_with_report(page.encode("euc-jp"), "text/html")
    assert [e.text for e in report.elements] == [KANJI_ONLY[8], KANJI_ONLY[3]]
