#[distlock::locked(name = "report")]
async fn report() -> distlock::Result<()> {
    Ok(())
}

fn main() {}
